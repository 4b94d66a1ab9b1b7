/* pytest-gsm8k report page. Builds one summary row per problem from the embedded JSON, once;
   fills a problem's details the first time it is opened; filters by toggling `hidden`.
   Model and dataset text only ever goes into the page through textContent. */
(function () {
  "use strict";
  var t0 = performance.now();
  var data = JSON.parse(document.getElementById("gsm8k-data").textContent);
  var parsedMs = performance.now() - t0;
  var list = document.getElementById("rows");
  var fOutcome = document.getElementById("f-outcome");
  var fChange = document.getElementById("f-change");
  var fConfig = document.getElementById("f-config");  /* --gsm8k-config: one config's rows */
  var fSearch = document.getElementById("f-search");
  var fCount = document.getElementById("f-count");
  var rows = [];
  var groups = [];

  function el(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }
  function add(parent, tag, cls, text) {
    return parent.appendChild(el(tag, cls, text));
  }
  function num(v) {
    return v === null || v === undefined ? "\u2014" : String(v);
  }
  function plural(n, word) {
    return n + " " + word + (n === 1 ? "" : "s");
  }
  function snippet(text, n) {
    text = (text || "").replace(/\s+/g, " ").trim();
    return text.length > n ? text.slice(0, n - 1) + "\u2026" : text;
  }

  /* The response with its reasoning folded: a <think> block, else every line before the last. */
  function responseBlock(text) {
    var wrap = el("div", "response");
    var think = /<think>([\s\S]*?)(?:<\/think>|$)/.exec(text);
    var reasoning = "";
    var answer = text;
    if (think) {
      reasoning = think[1].trim();
      answer = (text.slice(0, think.index) + text.slice(think.index + think[0].length)).trim();
    } else {
      var cut = text.replace(/\s+$/, "").lastIndexOf("\n");
      if (cut > 0) {
        reasoning = text.slice(0, cut);
        answer = text.slice(cut + 1);
      }
    }
    if (reasoning) {
      var d = add(wrap, "details", "reasoning");
      add(d, "summary", null, (think ? "reasoning (think block): " : "reasoning: ") +
        plural(reasoning.split("\n").length, "line") + ", " +
        plural(reasoning.length, "character"));
      add(d, "pre", null, reasoning);
    }
    add(wrap, "pre", "final", answer || "(empty response)");
    return wrap;
  }

  function ruleTable(p) {
    var table = el("table", "extract");
    var head = add(add(table, "thead"), "tr");
    add(head, "th", null, "extractor");
    p.sm.forEach(function (s, i) { add(head, "th", null, p.sm.length > 1 ? "#" + (i + 1) : "number"); });
    add(head, "th", null, "problem");
    var body = add(table, "tbody");
    data.rules.forEach(function (rule) {
      var tr = add(body, "tr");
      add(tr, "th", null, rule + (rule === data.gated ? " *" : ""));
      p.sm.forEach(function (s) {
        var v = s.x[rule];
        add(tr, "td", v !== undefined && v !== null && String(v) === String(p.g) ? "hit" : "", num(v));
      });
      var ok = p.rules[rule];
      add(tr, "td", ok ? "hit" : "miss", ok ? "\u2713 correct" : "\u2717");
    });
    return table;
  }

  function fill(row, p) {
    row.filled = true;
    var body = add(row, "div", "body");
    var left = add(body, "section", "problem");
    add(left, "h4", null, "question");
    add(left, "p", "question", p.q || "(the question is not in the report)");
    var gold = add(left, "p");
    add(gold, "b", null, "gold answer ");
    add(gold, "span", "num", p.g);
    if (p.s) {
      add(left, "h4", null, "worked solution");
      add(left, "pre", "solution", p.s);
    }
    var right = add(body, "section", "answer");
    var verdicts = add(right, "p", "verdicts");
    add(verdicts, "span", "badge o-" + p.o, "now: " + p.o);
    if (data.baseline && p.ch !== "none") {
      add(verdicts, "span", "badge o-" + (p.b || "none").replace(/\s+/g, "-"),
        "baseline: " + (p.b || "not in baseline"));
    }
    if (p.ch && p.ch !== "none") add(verdicts, "span", "flag " + p.ch, "newly " + p.ch);
    var ex = add(right, "p");
    add(ex, "b", null, "extracted ");
    add(ex, "span", "num", p.x === null || p.x === undefined ? "none" : p.x);
    if (p.ns > 1) ex.appendChild(document.createTextNode("  (" + p.nc + " of " + p.ns + " samples correct)"));
    if (p.v && p.v.length) {
      add(right, "p", "note", "votes: " + p.v.map(function (v) { return v[0] + " \u00d7" + v[1]; }).join(", "));
    }
    if (p.e) add(right, "pre", "error", p.e);
    if (p.note) add(right, "p", "note", p.note);
    if (p.sm.length) right.appendChild(ruleTable(p));
    p.sm.forEach(function (s, i) {
      add(right, "h4", null, (p.sm.length > 1 ? "sample " + (i + 1) : "response") +
        " \u00b7 finish " + (s.f || "?"));
      right.appendChild(responseBlock(s.t !== undefined ? s.t : p.r));
    });
    if (p.u && (p.u.prompt_tokens || p.u.completion_tokens)) {
      add(right, "p", "note", "tokens: prompt " + (p.u.prompt_tokens || 0) + ", completion " +
        (p.u.completion_tokens || 0));
    }
  }

  /* One row is cloned from a prototype and its five text slots filled: several times faster
     than creating each element, which matters at 1,319 rows. */
  var proto = el("details", "row");
  var protoSummary = add(proto, "summary");
  ["pid", "badge", "was", "nums", "q"].forEach(function (cls) { add(protoSummary, "span", cls); });
  if (!data.baseline) protoSummary.removeChild(protoSummary.querySelector(".was"));
  function buildRow(p) {
    var row = proto.cloneNode(true);
    row.className = "row o-" + p.o + (p.ch ? " ch-" + p.ch : "");
    row.id = "p-" + p.id;
    var slots = row.firstChild.childNodes;
    var i = 0;
    slots[i++].textContent = p.id;
    slots[i].className = "badge o-" + p.o;
    slots[i++].textContent = p.o;
    /* "none": a config compared with no baseline (--gsm8k-config), so nothing to say */
    if (data.baseline) slots[i++].textContent = p.ch === "none" ? "" : p.b ? "was " + p.b : "new";
    slots[i++].textContent = "gold " + num(p.g) + " \u00b7 got " + num(p.x);
    slots[i].textContent = snippet(p.q || p.r, 150);
    return row;
  }
  var byRow = new Map();
  list.addEventListener("toggle", function (event) {  /* toggle does not bubble: capture it */
    var row = event.target;
    if (row.open && !row.filled && byRow.has(row)) fill(row, byRow.get(row));
  }, true);

  var GROUP_TITLES = {
    failing: "Newly failing", passing: "Newly passing", "": "Unchanged", none: "No baseline"
  };
  var frag = document.createDocumentFragment();
  var group = null;
  /* one group per change, and per config under --gsm8k-config (its rows come in run order) */
  data.problems.forEach(function (p) {
    var key = p.ch + "\u0000" + (p.c || "");
    if (data.baseline && (!group || group.key !== key)) {
      group = { key: key, ch: p.ch, c: p.c, el: el("h3", "group g-" + (p.ch || "same")),
        total: 0, visible: 0 };
      groups.push(group);
      frag.appendChild(group.el);
    }
    if (group) group.total += 1;
    var row = buildRow(p);
    byRow.set(row, p);
    frag.appendChild(row);
    rows.push({ p: p, el: row, g: group });
  });
  groups.forEach(function (g) {
    g.el.textContent = GROUP_TITLES[g.ch] + (g.c ? ": " + g.c : "") + " (" + g.total + ")";
  });
  list.appendChild(frag);

  function haystack(p) {
    if (p.h === undefined) {
      p.h = [p.id, p.q, p.r, p.e || ""].concat(p.sm.map(function (s) { return s.t || ""; }))
        .join("\n").toLowerCase();
    }
    return p.h;
  }

  function apply() {
    var t = performance.now();
    var o = fOutcome.value;
    var c = fChange ? fChange.value : "all";
    var cf = fConfig ? fConfig.value : "all";
    var q = fSearch.value.trim().toLowerCase();
    var shown = 0;
    groups.forEach(function (g) { g.visible = 0; });
    for (var i = 0; i < rows.length; i++) {
      var p = rows[i].p;
      var ok = (o === "all" || (o === "notcorrect" ? p.o !== "correct" : p.o === o)) &&
        (c === "all" || (c === "same" ? !p.ch : p.ch === c)) &&
        (cf === "all" || p.c === cf) &&
        (!q || haystack(p).indexOf(q) >= 0);
      if (rows[i].el.hidden === ok) rows[i].el.hidden = !ok;
      if (ok) {
        shown += 1;
        if (rows[i].g) rows[i].g.visible += 1;
      }
    }
    groups.forEach(function (g) { g.el.hidden = g.visible === 0; });
    fCount.textContent = shown + " of " + rows.length + " shown";
    report.timings.lastFilterMs = performance.now() - t;
    return shown;
  }

  fOutcome.addEventListener("change", apply);
  if (fChange) fChange.addEventListener("change", apply);
  if (fConfig) fConfig.addEventListener("change", apply);
  fSearch.addEventListener("input", apply);
  var report = {
    timings: { parseMs: parsedMs, buildMs: performance.now() - t0, readyAt: 0, lastFilterMs: 0 },
    apply: apply,
  };
  window.gsm8kReport = report;
  apply();
  report.timings.readyAt = performance.now();
  document.documentElement.setAttribute("data-ready", String(rows.length));
})();
