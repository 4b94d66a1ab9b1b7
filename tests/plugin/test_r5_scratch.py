import pytest
from helpers import GsmRun, output

@pytest.mark.parametrize("xd", [[], ["-n", "2"], ["-n", "3"]], ids=["plain", "n2", "n3"])
@pytest.mark.parametrize("k", ["test_u", "test-00"], ids=["useronly", "few"])
def test_k(pytester, server, gsm8k_run, xd, k):
    pytester.makepyfile(test_user="def test_u(): pass\n")
    result, data = gsm8k_run("--gsm8k-limit=30", "--gsm8k-min-acc=0.5", "--gsm8k-no-cache", "-k", k, ret=None, report=None, xdist=xd)
    out = output(result)
    print("K", k, xd, result.ret, [l for l in out.splitlines() if "gsm8k" in l or "passed" in l or "skipped" in l][:6])
