// skyrl view: metrics charts, sample trajectories and RLM trees of run folders, and evaluations (skyrl eval).
// Data comes from the server's JSON API, or from window.SKYRL_EXPORT in an exported file.
"use strict";

const EXPORT = window.SKYRL_EXPORT || null;
const POLL_MS = 2000;
const COLORS = ["#2f6fdb", "#d9480f", "#2b8a3e", "#862e9c", "#c92a2a", "#0b7285", "#e67700", "#5c940d"];
const PANELS = [
  { id: "reward", title: "Reward (mean ± std)", keys: ["reward/mean"], band: "reward/std", always: true },
  { id: "task-reward", title: "Task reward (env)", keys: ["env/task_reward"] },
  // held-out evaluation of fsdp_grpo (trainer.eval_*): step 0, every eval_every steps and the last step
  { id: "eval-reward", title: "Held-out reward (eval)", keys: ["eval/reward_mean"] },
  { id: "eval-pass-rate", title: "Held-out pass rate (eval)", keys: ["eval/pass_rate"] },
  { id: "eval-task-reward", title: "Held-out task reward (eval, env)", keys: ["eval/env/task_reward"] },
  { id: "loss", title: "Loss", keys: ["train/loss"] },
  { id: "kl", title: "KL", keys: ["train/kl"] },
  { id: "entropy", title: "Entropy", keys: ["train/entropy"] },
  { id: "grad-norm", title: "Grad norm", keys: ["train/grad_norm"] },
  { id: "zero-variance", title: "Groups with zero reward variance (share)", keys: ["train/zero_variance_groups"] },
  { id: "clip-fraction", title: "Clip fraction", keys: ["train/clip_fraction"] },
  { id: "logprob-gap", title: "Rollout/trainer logprob gap", keys: ["train/logprob_gap_mean", "train/logprob_gap_max"] },
  { id: "tokens", title: "Tokens per second", keys: ["throughput/generated_tokens_per_second", "throughput/train_tokens_per_second"] },
  { id: "step-time", title: "Step time (s)", keys: ["time/step_seconds"] },
];
const SHOWN_KEYS = new Set(PANELS.flatMap((p) => p.keys.concat(p.band ? [p.band] : [])));

const state = {
  runs: [], rows: [], problems: [], view: "metrics", run: 0, smoothing: 0, extra: [],
  samples: null, ids: new Set(), kids: new Map(), step: null, selected: null, treeRoot: null,
};

// ---- helpers ----------------------------------------------------------------------------------

async function api(path) {
  if (EXPORT) {
    if (!(path.split("?")[0] in EXPORT)) throw new Error(`this export does not hold ${path}`);
    return EXPORT[path.split("?")[0]];
  }
  const response = await fetch(`.${path}`, { cache: "no-store" });  // relative: works behind a path prefix
  const body = await response.json().catch(() => ({ error: `HTTP ${response.status} from ${path}` }));
  if (!response.ok) throw new Error(body.detail || `HTTP ${response.status}`);
  return body;
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (typeof value === "function") node.addEventListener(key.replace(/^on/, ""), value);
    else if (key === "text") node.textContent = value;
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child !== null && child !== undefined && child !== false) node.append(child);
  }
  return node;
}

const $ = (id) => document.getElementById(id);
const fmt = (v) => (typeof v === "number" ? String(Math.abs(v) >= 1000 ? Math.round(v) : Number(v.toPrecision(4))) : String(v));
// Ids are encoded as the export stores them (skyrl_viewer.api.sample_path): every byte but A-Z a-z 0-9 - . _ ~.
const encodeId = (id) => encodeURIComponent(id).replace(/[!'()*]/g, (c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`);
const sampleUrl = (id) => `/api/runs/${state.run}/samples/${encodeId(id)}`;

function setStatus(text) { $("status").textContent = text; }

function showNotices() {
  const box = $("notices");
  box.replaceChildren();
  state.runs.forEach((run, i) => {
    for (const problem of state.problems[i] || []) {
      box.append(el("div", { class: "notice", "data-run": i }, el("b", { text: run.name }), ` (${run.path}): ${problem}`));
    }
  });
}

function fail(where, error) {
  $("notices").append(el("div", { class: "notice error" }, `${where}: ${error.message || error}`));
}

// ---- metrics ----------------------------------------------------------------------------------

function smooth(values, weight) {
  if (!weight) return values;
  let last = null;
  return values.map((v) => (last = last === null ? v : last * weight + v * (1 - weight)));
}

function series(rows, key) {
  const points = rows.filter((r) => typeof r[key] === "number");
  return { x: points.map((r) => r.step), y: points.map((r) => r[key]) };
}

function panelTraces(panel) {
  const traces = [];
  state.rows.forEach((rows, run) => {
    const color = COLORS[run % COLORS.length];
    const runName = state.runs[run].name;
    panel.keys.forEach((key, k) => {
      const { x, y } = series(rows, key);
      if (!x.length) return;
      const name = state.runs.length > 1 ? (panel.keys.length > 1 ? `${runName} ${key}` : runName) : key;
      if (panel.band && k === 0) {
        const std = series(rows, panel.band);
        if (std.x.length === x.length) {
          const hi = y.map((v, i) => v + std.y[i]), lo = y.map((v, i) => v - std.y[i]);
          const band = { x, mode: "lines", line: { width: 0, color }, hoverinfo: "skip", showlegend: false };
          traces.push({ ...band, y: hi, meta: { run, key, kind: "band" } });
          traces.push({ ...band, y: lo, fill: "tonexty", opacity: 0.15, fillcolor: color + "26", meta: { run, key, kind: "band" } });
        }
      }
      const line = { color, dash: ["solid", "dot", "dash"][k % 3] };
      if (state.smoothing) {
        traces.push({ x, y, name, mode: "lines", line: { ...line, width: 1 }, opacity: 0.3, showlegend: false,
          hovertemplate: "raw %{y:.4g}<extra>%{fullData.name}</extra>", meta: { run, key, kind: "raw" } });
        traces.push({ x, y: smooth(y, state.smoothing), name, mode: "lines", line,
          hovertemplate: "%{y:.4g}<extra>%{fullData.name}</extra>", meta: { run, key, kind: "smoothed" } });
      } else {
        traces.push({ x, y, name, mode: "lines+markers", line, marker: { size: 5 },
          hovertemplate: "%{y:.4g}<extra>%{fullData.name}</extra>", meta: { run, key, kind: "raw" } });
      }
    });
  });
  return traces;
}

function allKeys() {
  const keys = new Set();
  for (const rows of state.rows) for (const row of rows) for (const [k, v] of Object.entries(row)) {
    if (typeof v === "number" && k !== "step" && k !== "time") keys.add(k);
  }
  return [...keys].sort();
}

const keyPanel = (k) => ({ id: k.replace(/\W+/g, "-"), title: k, keys: [k] });

// Training panels (fixed, plus the ones added from the menu) and the env's own metrics (env/*, and eval/env/*
// of the held-out evaluation).
function panels() {
  const keys = allKeys();
  const present = (panel) => panel.always || panel.keys.some((k) => keys.includes(k));
  return {
    main: PANELS.filter(present).concat(state.extra.map(keyPanel)),
    env: keys.filter((k) => (k.startsWith("env/") || k.startsWith("eval/env/")) && !SHOWN_KEYS.has(k)).map(keyPanel),
  };
}

// Steps with no learning signal (the trainer's train/no_signal_steps streak > 0: nearly every group's samples
// scored alike, so advantages, loss and gradient were 0), shaded in the run's colour on every chart.
function noSignalShapes() {
  const shapes = [];
  state.rows.forEach((rows, run) => {
    const steps = rows.filter((r) => r["train/no_signal_steps"] > 0).map((r) => r.step).sort((a, b) => a - b);
    for (let i = 0; i < steps.length; i++) {
      let j = i;
      while (j + 1 < steps.length && steps[j + 1] === steps[j] + 1) j++;
      shapes.push({ type: "rect", xref: "x", yref: "paper", x0: steps[i] - 0.5, x1: steps[j] + 0.5, y0: 0, y1: 1,
        fillcolor: COLORS[run % COLORS.length], opacity: 0.12, line: { width: 0 }, layer: "below",
        name: `no-signal run ${run} steps ${steps[i]}-${steps[j]}` });
      i = j;
    }
  });
  return shapes;
}

function drawPanels(box, wanted, lastStep) {
  for (const div of [...box.children]) if (!wanted.some((p) => `chart-${p.id}` === div.id)) div.remove();
  const shapes = noSignalShapes();
  for (const panel of wanted) {
    let div = $(`chart-${panel.id}`);
    if (!div) box.append((div = el("div", { class: "chart", id: `chart-${panel.id}` })));
    const layout = {
      title: { text: panel.title, font: { size: 14 }, x: 0.02, xanchor: "left" }, margin: { l: 55, r: 15, t: 36, b: 30 },
      hovermode: "x unified", xaxis: { dtick: lastStep <= 12 ? 1 : null },
      showlegend: true, legend: { orientation: "h", y: -0.12 }, uirevision: panel.id, shapes,
    };
    Plotly.react(div, panelTraces(panel), layout, { displaylogo: false, responsive: true });
  }
}

function renderMetrics() {
  renderEvals();
  const box = $("charts");
  const steps = state.rows.reduce((n, rows) => n + rows.length, 0);
  const evalsOnly = state.runs.every((run) => run.eval);  // evaluations train no steps: their summary is the view
  $("chart-controls").hidden = evalsOnly && !steps;
  if (evalsOnly && !steps) {
    box.replaceChildren();
    $("env-section").hidden = true;
    return;
  }
  if (!window.Plotly) {
    box.replaceChildren(el("div", { class: "empty" }, "The chart library (plotly.min.js) did not load."));
    return;
  }
  if (!steps) {
    const why = state.problems.flat().join("; ") || "no metrics rows yet";
    box.replaceChildren(el("div", { class: "empty", id: "no-metrics" }, `No metrics to chart: ${why}`));
    $("env-section").hidden = true;
    return;
  }
  box.querySelector(".empty")?.remove();
  const { main, env } = panels();
  const lastStep = Math.max(...state.rows.flat().map((r) => r.step));
  drawPanels(box, main, lastStep);
  $("env-section").hidden = !env.length;
  $("env-count").textContent = `(${env.length})`;
  if ($("env-section").open) drawPanels($("env-charts"), env, lastStep);  // plotly needs a visible box
  const chosen = new Set(main.concat(env).flatMap((p) => p.keys));
  $("more-metrics").replaceChildren(el("option", { value: "", text: "metric…" }),
    ...allKeys().filter((k) => !chosen.has(k)).map((k) => el("option", { value: k, text: k })));
}

async function loadMetrics() {
  const answers = await Promise.all(state.runs.map((_, i) => api(`/api/runs/${i}/metrics`).catch((e) => ({ rows: [], problems: [String(e.message)] }))));
  state.rows = answers.map((a) => a.rows);
  state.problems = answers.map((a) => a.problems);
}

async function poll() {
  let changed = false;
  await Promise.all(state.runs.map(async (_, i) => {
    const have = state.rows[i].length;
    const answer = await api(`/api/runs/${i}/metrics?from=${have}`);
    if (answer.total < have) {  // the file was rewritten (a resumed run drops steps after its checkpoint)
      state.rows[i] = (await api(`/api/runs/${i}/metrics`)).rows;
      changed = true;
    } else if (answer.rows.length) {
      state.rows[i] = state.rows[i].concat(answer.rows);
      changed = true;
    }
    if (JSON.stringify(answer.problems) !== JSON.stringify(state.problems[i])) {
      state.problems[i] = answer.problems;
      changed = true;
    }
  }));
  if (changed) {
    showNotices();
    renderMetrics();
    if (state.view !== "metrics") {  // new steps' samples and trees join the lists; the open one stays
      await loadSamples();
      if (state.view === "samples") renderSamples();
      else renderTrees();
    }
  }
  setStatus(`live · ${new Date().toLocaleTimeString()}`);
}

// ---- evaluations (results folders of skyrl eval) ------------------------------------------------

const shown = (v) => (v === null || v === undefined ? "-" : fmt(v));

function evalPanel(run) {
  const { info = {}, metrics = {}, per_task: table = {} } = run.eval;
  const tasks = Array.isArray(table.tasks) ? table.tasks : [];
  const columns = (table.columns || []).filter((c) => c !== "errors" || tasks.some((t) => t.errors));
  const source = info.tasks_file ? `file ${info.tasks_file}` : `split ${info.split}`;
  const facts = [["env", info.env], ["model", info.model], ["engine", info.engine], ["generator", info.generator],
    ["tasks", info.tasks !== undefined ? `${info.tasks} from ${source}` : null], ["samples per task", info.samples_per_task],
    ["passing", info.pass_threshold !== undefined ? `reward ≥ ${fmt(info.pass_threshold)}` : null], ["started", info.started]];
  const numbers = Object.entries(metrics).filter(([, v]) => typeof v === "number");
  return el("section", { class: "eval", "data-run": run.index },
    el("h2", { text: `Evaluation: ${run.name}` }),
    el("div", {}, ...facts.filter(([, v]) => v !== null && v !== undefined).map(([k, v]) => el("span", { class: "badge" }, `${k} ${fmt(v)}`))),
    el("div", { class: "eval-tables" },
      el("div", {}, el("h3", { text: "Summary" }), el("table", { class: "kv eval-metrics" },
        ...numbers.map(([k, v]) => el("tr", {}, el("td", { text: k }), el("td", { text: fmt(v) }))))),
      tasks.length ? el("div", {}, el("h3", { text: `Per task (${tasks.length})` }), el("table", { class: "grid eval-tasks" },
        el("tr", {}, ...columns.map((c) => el("th", { text: c }))),
        ...tasks.map((t) => el("tr", {}, ...columns.map((c) => el("td", { text: shown(t[c]) })))))) : ""));
}

function renderEvals() {
  const evals = state.runs.filter((run) => run.eval);
  $("eval-summary").hidden = !evals.length;
  $("eval-summary").replaceChildren(...evals.map(evalPanel));
}

// ---- samples ----------------------------------------------------------------------------------

async function loadSamples() {
  try {
    state.samples = await api(`/api/runs/${state.run}/samples`);
  } catch (error) {
    state.samples = { samples: [], problems: [String(error.message)] };
  }
  state.ids = new Set(state.samples.samples.map((s) => s.id));
  state.kids = new Map();
  for (const s of state.samples.samples) {
    if (state.ids.has(s.parent_id)) state.kids.set(s.parent_id, [...(state.kids.get(s.parent_id) || []), s]);
  }
}

function childrenOf(id) { return state.kids.get(id) || []; }

// An evaluation's samples have no training step: they are all of the evaluation.
function stepName(step) {
  if (step !== null) return `step ${step}`;
  return state.runs[state.run]?.eval ? "evaluation" : "unknown";
}

function isRoot(s) { return !state.ids.has(s.parent_id); }

function summaryLine(s) {
  const kids = childrenOf(s.id).length;
  return [`#${s.sample_index ?? "?"} ${s.group_id ?? ""}`, `reward ${fmt(s.reward ?? 0)}`, s.stop_reason,
    kids ? `${kids} children` : null, s.error ? "error" : null].filter(Boolean).join(" · ");
}

function renderSamples() {
  const list = $("sample-list");
  const samples = state.samples.samples;
  $("sample-problems").replaceChildren(...state.samples.problems.map((p) => el("div", { class: "notice", text: p })));
  if (!samples.length) {
    list.replaceChildren(el("li", { class: "heading" }, "No samples"));
    $("sample-detail").replaceChildren(el("div", { class: "empty", id: "no-samples" },
      `No samples to show: ${state.samples.problems.join("; ") || "samples.jsonl holds no trajectories yet"}`));
    $("step-select").replaceChildren();
    return;
  }
  const steps = [...new Set(samples.map((s) => s.step ?? null))].sort((a, b) => (a ?? -1) - (b ?? -1));
  if (!steps.includes(state.step)) state.step = steps[steps.length - 1];
  $("step-select").replaceChildren(...steps.map((step) => el("option", { value: String(step), selected: step === state.step, text: stepName(step) })));
  list.replaceChildren(...samples.filter((s) => (s.step ?? null) === state.step && isRoot(s)).map((s) =>
    el("li", { "data-sample-id": s.id, class: s.id === state.selected ? "selected" : null, onclick: () => selectSample(s.id) },
      summaryLine(s), el("span", { class: "title", text: s.title || "" }))));
}

async function selectSample(id) {
  state.selected = id;
  for (const li of $("sample-list").children) li.classList.toggle("selected", li.dataset.sampleId === id);
  await renderDetail($("sample-detail"), id);
}

// ---- one trajectory -----------------------------------------------------------------------------

const CALL = /\b(rlm_query_batched|rlm_query|llm_query_batched|llm_query)\s*\(/g;
const FENCE = /^[ \t]*```([\w+-]*)[^\n]*\n([\s\S]*?)(?:^[ \t]*```[ \t]*$|(?![\s\S]))/gm;  // an open block runs to the end
const TAGS = /<(sql|solution|observation)>([\s\S]*?)<\/\1>/g;

// Code with rlm_query call sites as links (when the trajectory has children to point at); a link
// passes ``onCall`` the code from its call to the next one, where the call's prompts are written.
function codeNode(code, lang, onCall) {
  const pre = el("pre", { class: `code lang-${lang || "text"}` }, el("span", { class: "label", text: lang || "code" }));
  const calls = [...code.matchAll(CALL)];
  let last = 0;
  calls.forEach((match, i) => {
    pre.append(code.slice(last, match.index));
    if (onCall && match[1].startsWith("rlm_query")) {
      const segment = code.slice(match.index, calls[i + 1]?.index ?? code.length);
      pre.append(el("a", { class: "call-site", title: "show the child episodes of this call", onclick: () => onCall(segment) }, match[0]));
    } else pre.append(match[0]);
    last = match.index + match[0].length;
  });
  pre.append(code.slice(last));
  return pre;
}

// Message text with fenced blocks (REPL, shell, SQL) as code and <sql>/<observation> tags set apart.
function contentNodes(text, onCall) {
  const nodes = [];
  let last = 0;
  const parts = [];
  for (const m of text.matchAll(FENCE)) parts.push({ index: m.index, end: m.index + m[0].length, node: codeNode(m[2].replace(/\n$/, ""), m[1], onCall) });
  for (const m of text.matchAll(TAGS)) {
    if (parts.some((p) => m.index >= p.index && m.index < p.end)) continue;
    const node = m[1] === "observation" ? el("pre", { class: "output" }, el("span", { class: "label", text: "result" }), m[2].trim())
      : codeNode(m[2].trim(), m[1], null);
    parts.push({ index: m.index, end: m.index + m[0].length, node });
  }
  parts.sort((a, b) => a.index - b.index);
  for (const part of parts) {
    if (part.index > last) nodes.push(el("div", { class: "text", text: text.slice(last, part.index) }));
    nodes.push(part.node);
    last = part.end;
  }
  if (last < text.length) nodes.push(el("div", { class: "text", text: text.slice(last) }));
  return nodes;
}

function messagesOf(record) {
  if (Array.isArray(record.messages) && record.messages.length) return record.messages;
  return (record.turns || []).flatMap((t) => [{ role: "assistant", content: t.action }, ...(t.observation || [])]);
}

function conversation(record, onCall) {
  let users = 0;
  return messagesOf(record).map((m) => {
    const role = String(m.role || "?");
    const text = typeof m.content === "string" ? m.content : JSON.stringify(m.content);
    // after the first user message, user/tool messages are the env's answers: REPL output, query results, shell output
    const observation = (role === "user" && users++ > 0) || role === "tool";
    const body = role === "assistant" || /<observation>/.test(text) ? contentNodes(text, role === "assistant" ? onCall : null)
      : observation ? [el("pre", { class: "output", text })] : [el("div", { class: "text", text })];
    return el("div", { class: `msg ${role}${observation ? " observation" : ""}` },
      el("div", { class: "role", text: observation && role === "user" ? "user · env output" : role }), ...body);
  });
}

function tokenView(record) {
  const ids = record.response_ids || [], mask = record.loss_mask || [], logprobs = record.logprobs || [];
  const versions = record.policy_versions || [];
  const text = record.token_text || {};
  const spans = ids.map((id, i) => {
    const label = text.response ? text.response[i] : `[${id}]`;
    const shown = label.replace(/\n/g, "↵\n");
    if (!mask[i]) return el("span", { class: "tok masked", title: `id ${id} · loss mask 0 (env tokens, not trained)`, text: shown });
    const lp = logprobs[i] ?? 0, p = Math.exp(lp);
    return el("span", { class: "tok", style: `background:hsl(${Math.round(120 * p)},75%,82%)`,
      title: `id ${id} · logprob ${lp.toFixed(3)} · p ${p.toFixed(3)} · loss mask 1`
        + (versions[i] >= 0 ? ` · policy version ${versions[i]}` : ""), text: shown });
  });
  const prompt = record.prompt_ids || [];
  const promptText = text.prompt ? text.prompt.join("") : prompt.join(" ");
  return [
    el("div", { class: "legend" }, "Generated tokens (loss mask 1) coloured by probability: ",
      el("span", { class: "tok", style: "background:hsl(0,75%,82%)", text: "p≈0" }), " … ",
      el("span", { class: "tok", style: "background:hsl(120,75%,82%)", text: "p≈1" }),
      "; ", el("span", { class: "tok masked", text: "grey underlined" }), " tokens have loss mask 0 (observations).",
      text.response ? "" : " No tokenizer could be loaded here, so ids are shown."),
    el("details", {}, el("summary", { text: `Prompt: ${prompt.length} tokens (not trained)` }), el("pre", { class: "code", text: promptText })),
    el("div", { class: "tokens", id: "tokens" }, ...spans),
  ];
}

function badges(s) {
  return [
    ["reward", s.reward], ["advantage", s.advantage],
    ["stop", s.truncated_reason ? `${s.stop_reason} (${s.truncated_reason})` : s.stop_reason],
    ["env", s.env_id], ["depth", s.depth], ["step", s.step], ["group", s.group_id], ["sample", s.sample_index],
  ].filter(([, v]) => v !== null && v !== undefined && v !== "")
    .map(([k, v]) => el("span", { class: "badge" }, `${k} ${fmt(v)}`))
    .concat(s.error ? [el("span", { class: "badge bad" }, `error: ${s.error}`)] : [],
      s.refusals ? [el("span", { class: "badge bad" }, `budget: ${s.refusals} sub-call(s) refused`)] : []);
}

function metricsTable(record) {
  const rows = Object.entries(record.metrics || {}).filter(([, v]) => typeof v === "number");
  const info = (record.turns || []).at(-1)?.info || {};
  for (const [k, v] of Object.entries(info)) if (["number", "boolean", "string"].includes(typeof v)) rows.push([`info.${k}`, v]);
  if (!rows.length) return [];
  return [el("h3", { text: "Env metrics" }), el("table", { class: "kv" },
    ...rows.map(([k, v]) => el("tr", {}, el("td", { text: k }), el("td", { text: fmt(v) }))))];
}

// A large sample comes with its longest texts cut: say so, and where the full one is.
function cutNotice(record, id) {
  if (!record.cut_chars) return "";
  const full = EXPORT ? " The full sample is not in this export: serve the run with skyrl view to read it."
    : el("a", { class: "full-sample", href: `.${sampleUrl(id)}/full`, target: "_blank", text: "Open the full sample (JSON)" });
  return el("div", { class: "notice cut" }, `This sample is large: ${record.cut_chars.toLocaleString("en")} characters `
    + "of its texts are not shown (each cut text ends with “… [N more characters cut]”). ", full);
}

async function renderDetail(box, id, onCall) {
  box.replaceChildren(el("p", { class: "hint", text: "loading…" }));
  delete box.dataset.sampleId;
  box.pending = id;  // a later click wins over an answer still on its way
  let record;
  try {
    record = (await api(sampleUrl(id))).sample;
  } catch (error) {
    if (box.pending === id) box.replaceChildren(el("div", { class: "empty", text: `Cannot show sample ${id}: ${error.message}` }));
    return;
  }
  if (box.pending !== id) return;
  const s = record.summary;
  box.replaceChildren(
    el("h2", { text: s.title || id }), cutNotice(record, id), el("div", {}, ...badges(s)),
    s.final_answer ? el("p", {}, el("b", { text: "Final answer: " }), s.final_answer) : "",
    ...metricsTable(record), el("h3", { text: "Conversation" }),
    el("div", { class: "conversation" }, ...conversation(record, onCall)),
    el("h3", { text: "Tokens" }), ...tokenView(record));
  box.dataset.sampleId = id;
}

// ---- trees --------------------------------------------------------------------------------------

function treeNode(s) {
  const kids = childrenOf(s.id);
  const facts = [`depth ${s.depth}`, `reward ${fmt(s.reward ?? 0)}`,
    s.advantage !== null && s.advantage !== undefined ? `adv ${fmt(s.advantage)}` : null, s.stop_reason,
    s.refusals ? `budget stop: ${s.refusals} refused` : null, s.truncated_reason, s.error ? "error" : null];
  const node = el("span", { class: `node${s.id === state.selected ? " selected" : ""}`, "data-node-id": s.id, "data-depth": s.depth,
    onclick: () => selectNode(s.id) }, facts.filter(Boolean).join(" · "),
  el("span", { class: "title", text: s.depth ? `prompt: ${s.title}` : s.title }),
  s.final_answer && s.depth ? el("span", { class: "title", text: `→ ${s.final_answer}` }) : "");
  return el("li", {}, node, kids.length ? el("ul", {}, ...kids.map(treeNode)) : "");
}

function renderTrees() {
  const roots = state.samples.samples.filter((s) => isRoot(s) && childrenOf(s.id).length);
  const list = $("tree-list");
  if (!roots.length) {
    list.replaceChildren();
    $("tree").replaceChildren(el("div", { class: "empty", id: "no-trees" },
      state.samples.samples.length ? "No trees in this run: samples.jsonl holds no child episodes (trees come from "
        + "the rlm_tree generator, whose roots call rlm_query)." : `No samples: ${state.samples.problems.join("; ") || "samples.jsonl is empty"}`));
    $("tree-detail").replaceChildren();
    return;
  }
  if (!roots.some((r) => r.id === state.treeRoot)) state.treeRoot = roots[0].id;
  let lastStep;
  list.replaceChildren(...roots.flatMap((r) => {
    const items = [];
    if (r.step !== lastStep) items.push(el("li", { class: "heading", text: `step ${r.step ?? "?"}` }));
    lastStep = r.step;
    items.push(el("li", { "data-root-id": r.id, class: r.id === state.treeRoot ? "selected" : null,
      onclick: () => { state.treeRoot = r.id; state.selected = r.id; renderTrees(); } },
    summaryLine(r), el("span", { class: "title", text: r.title })));
    return items;
  }));
  const root = state.samples.samples.find((s) => s.id === state.treeRoot);
  $("tree").replaceChildren(el("ul", { class: "tree" }, treeNode(root)));
  const inTree = (id) => !!$("tree").querySelector(`[data-node-id="${CSS.escape(id)}"]`);
  selectNode(state.selected && inTree(state.selected) ? state.selected : root.id);
}

async function selectNode(id) {
  state.selected = id;
  for (const node of $("tree").querySelectorAll(".node")) node.classList.toggle("selected", node.dataset.nodeId === id);
  const kids = childrenOf(id);
  // the children whose prompt is written at the call site, else (prompts built at run time) all of them
  const flash = (segment) => {
    const code = segment.replace(/\s+/g, " ");
    const named = kids.filter((k) => k.title && code.includes(k.title.replace(/…$/, "")));
    const targets = named.length ? named : kids;
    for (const node of $("tree").querySelectorAll(".node")) node.classList.toggle("flash", targets.some((k) => k.id === node.dataset.nodeId));
    $("tree").querySelector(".node.flash")?.scrollIntoView({ block: "nearest" });
  };
  await renderDetail($("tree-detail"), id, kids.length ? flash : null);
}

// ---- page ---------------------------------------------------------------------------------------

async function show(view) {
  state.view = ["metrics", "samples", "trees"].includes(view) ? view : "metrics";
  for (const a of $("tabs").children) a.classList.toggle("active", a.dataset.view === state.view);
  for (const section of document.querySelectorAll(".view")) section.hidden = section.id !== `view-${state.view}`;
  $("run-picker").hidden = state.view === "metrics" || state.runs.length < 2;
  if (state.view === "metrics") return renderMetrics();
  await loadSamples();
  if (state.view === "samples") {
    renderSamples();
    const first = $("sample-list").querySelector("li[data-sample-id]");
    if (first && !$("sample-list").querySelector("li.selected")) await selectSample(first.dataset.sampleId);
  } else renderTrees();
}

async function main() {
  try {
    state.runs = (await api("/api/runs")).runs;
  } catch (error) {
    setStatus("no data");
    fail("Cannot read the runs", error);
    return;
  }
  if (!state.runs.length) {
    $("charts").replaceChildren(el("div", { class: "empty", text: "No runs given." }));
    return;
  }
  $("run-select").replaceChildren(...state.runs.map((r, i) => el("option", { value: String(i), text: r.name })));
  $("run-select").addEventListener("change", (e) => { state.run = Number(e.target.value); state.selected = null; show(state.view); });
  $("step-select").addEventListener("change", (e) => { state.step = e.target.value === "null" ? null : Number(e.target.value); renderSamples(); });
  $("smoothing").addEventListener("input", (e) => { state.smoothing = Number(e.target.value); $("smoothing-value").textContent = e.target.value; renderMetrics(); });
  $("more-metrics").addEventListener("change", (e) => { if (e.target.value) state.extra.push(e.target.value); renderMetrics(); });
  $("env-section").addEventListener("toggle", renderMetrics);
  window.addEventListener("hashchange", () => show(location.hash.slice(1)));
  await loadMetrics();
  showNotices();
  await show(location.hash.slice(1));
  if (EXPORT) setStatus("exported snapshot");
  else {
    setStatus("live");
    setInterval(() => poll().catch((error) => setStatus(`live updates paused: ${error.message}`)), POLL_MS);
  }
}

main().catch((error) => fail("skyrl view failed", error));
