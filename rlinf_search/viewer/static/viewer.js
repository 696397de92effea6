// rlinf-search view: a run's rollout dumps and curves. Plain JavaScript, no build step, nothing fetched from
// outside this server (the machines it runs on are often offline).
"use strict";

const state = { run: null, rows: [], selected: null, dump: null };
const $ = (id) => document.getElementById(id);

function esc(text) {
  return String(text).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}

async function getJSON(url) {
  const response = await fetch(url);
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

function fmt(value, digits = 3) {
  return value === null || value === undefined || Number.isNaN(value) ? "-" : Number(value).toFixed(digits);
}

// ---- the trajectories panel ---------------------------------------------------------------------------
function dumpsShown() {
  const monitor = $("filter-monitor").value;
  const firing = state.run.firings.find((f) => f.monitor === monitor);
  // a monitor picked: only the rollout files written once its collapse was under way
  return state.run.dumps.filter((d) => !firing || d.step >= firing.since);
}

function fillDumps() {
  const select = $("dump");
  const shown = dumpsShown();
  select.innerHTML = shown.map((d) => `<option value="${esc(d.name)}">${d.kind === "val" ? "validation" : "step"} ${d.step}</option>`).join("");
  if (shown.length) {
    const keep = shown.find((d) => d.name === state.dump);
    select.value = keep ? keep.name : shown[0].name;
    loadDump(select.value);
  } else {
    state.rows = [];
    renderList();
  }
}

async function loadDump(name) {
  const body = await getJSON(`/api/rollouts/${encodeURIComponent(name)}`);
  state.dump = name;
  state.rows = body.rows;
  const finish = $("filter-finish");
  const chosen = finish.value;
  const reasons = [...new Set(body.rows.map((r) => r.finish_reason))].sort();
  finish.innerHTML = `<option value="any">any</option>` + reasons.map((r) => `<option value="${esc(r)}">${esc(r)}</option>`).join("");
  finish.value = reasons.includes(chosen) ? chosen : "any";
  renderList();
}

function passes(row) {
  const reward = $("filter-reward").value, finish = $("filter-finish").value, searches = $("filter-searches").value;
  if (reward === "positive" && !(row.reward > 0)) return false;
  if (reward === "zero" && row.reward !== 0) return false;
  if (finish !== "any" && row.finish_reason !== finish) return false;
  if (searches === "2+" ? row.searches < 2 : searches !== "any" && row.searches !== Number(searches)) return false;
  return true;
}

function renderList() {
  const shown = state.rows.filter(passes);
  $("listed").textContent = `${shown.length} of ${state.rows.length} trajectories`;
  $("list").querySelector("tbody").innerHTML = shown.map((r) => `
    <tr data-index="${r.index}" class="${state.selected === r.index ? "selected" : ""}">
      <td>${r.index}</td><td title="${esc(r.question)}">${esc(r.question.slice(0, 48))}</td><td>${fmt(r.reward, 2)}</td>
      <td>${fmt(r.advantage, 2)}</td><td>${r.searches}</td><td>${esc(r.finish_reason)}</td></tr>`).join("");
  for (const tr of $("list").querySelectorAll("tbody tr")) {
    tr.addEventListener("click", () => showTrajectory(Number(tr.dataset.index)));
  }
}

function highlighted(text, golds) {
  // the gold answers marked where a passage (or the model) wrote them
  const words = golds.filter((g) => g.trim()).map((g) => g.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"));
  if (!words.length) return esc(text);
  const pattern = new RegExp(`(${words.join("|")})`, "gi");
  return text.split(pattern).map((part, i) => (i % 2 ? `<mark class="gold">${esc(part)}</mark>` : esc(part))).join("");
}

function tokenVersions(span) {
  // one version per token, from the [version, tokens] runs
  const out = [];
  for (const [version, count] of span.versions || []) for (let i = 0; i < count; i += 1) out.push(version);
  return out;
}

function renderSpan(span, golds, turn) {
  const trained = span.kind === "model";
  let body;
  if (span.tokens) {
    const versions = tokenVersions(span);
    body = span.tokens.map((piece, i) => {
      const version = versions[i] ?? span.version;
      const cls = trained ? `tok trained v${((version ?? 0) % 4 + 4) % 4}` : "tok masked";
      const title = trained ? `trained, sampled by policy version ${version ?? "?"}` : "masked (an observation)";
      return `<span class="${cls}" title="${title}">${trained ? esc(piece) : highlighted(piece, golds)}</span>`;
    }).join("");
  } else {
    body = trained ? `<span class="tok trained">${esc(span.text)}</span>` : highlighted(span.text, golds);
  }
  const label = trained ? `model turn ${turn} (trained; policy version ${span.version ?? "?"})`
    : `${span.kind} (observation, masked)`;
  return `<div class="turn ${esc(span.kind)}"><span class="label">${label}</span>${body}</div>`;
}

function showTrajectory(index) {
  state.selected = index;
  renderList();
  const row = state.rows.find((r) => r.index === index);
  let turn = 0;
  const spans = row.response.map((span) => renderSpan(span, row.golden_answers, span.kind === "model" ? (turn += 1) : turn)).join("");
  $("detail").innerHTML = `
    <h2>${esc(row.question)}</h2>
    <div class="facts">
      <span>gold</span><span>${row.golden_answers.map(esc).join(" | ")}</span>
      <span>reward / EM</span><span>${fmt(row.reward)} / ${fmt(row.em)}</span>
      <span>advantage</span><span>${fmt(row.advantage)}</span>
      <span>finish</span><span>${esc(row.finish_reason)} after ${row.num_turns} turns</span>
      <span>queries</span><span>${row.queries.map(esc).join(" | ") || "none"}</span>
      <span>prompt</span><span>${esc(row.uid)}, sample ${row.sample ?? "-"}, ${esc(row.dump)}</span>
    </div>
    <p class="legend">Tokens, trained, by the policy version that sampled them (four colours in turn):
      <span class="tok trained">0, 4, ...</span><span class="tok trained v1">1, 5, ...</span>
      <span class="tok trained v2">2, 6, ...</span><span class="tok trained v3">3, 7, ...</span>
      <span class="tok masked">masked observation</span> <mark class="gold">gold answer</mark></p>
    <div id="turns">${spans}</div>
    <button id="follow">Follow this prompt across steps</button>
    <div id="followed"></div>`;
  $("follow").addEventListener("click", () => followPrompt(row.uid));
}

async function followPrompt(uid) {
  const body = await getJSON(`/api/prompt/${encodeURIComponent(uid)}`);
  $("followed").innerHTML = `<h3>${esc(uid)} across steps</h3><table><thead><tr><th>file</th><th>sample</th>
    <th>reward</th><th>searches</th><th>finish</th><th>queries</th></tr></thead><tbody>${body.rows.map((r) => `
    <tr><td>${esc(r.dump)}</td><td>${r.sample ?? "-"}</td><td>${fmt(r.reward, 2)}</td><td>${r.searches}</td>
    <td>${esc(r.finish_reason)}</td><td>${r.queries.map(esc).join(" | ")}</td></tr>`).join("")}</tbody></table>`;
}

// ---- the curves panel -------------------------------------------------------------------------------
const DEFAULT_CURVES = ["reward/mean", "val/em", "rollout/searches_per_trajectory", "rollout/response_length",
  "actor/entropy", "actor/kl", "rollout/repetition_share", "rollout/retrieval_hit_rate"];

function chart(name, points, firings) {
  const width = 380, height = 200, pad = 34;
  if (!points.length) return "";
  const xs = points.map((p) => p[0]), ys = points.map((p) => p[1]);
  const x0 = Math.min(...xs), x1 = Math.max(...xs, x0 + 1), y0 = Math.min(...ys), y1 = Math.max(...ys, y0 + 1e-9);
  const X = (x) => pad + ((x - x0) / (x1 - x0)) * (width - 2 * pad);
  const Y = (y) => height - pad - ((y - y0) / (y1 - y0 || 1)) * (height - 2 * pad);
  const line = points.map((p) => `${X(p[0]).toFixed(1)},${Y(p[1]).toFixed(1)}`).join(" ");
  const marks = firings.filter((f) => f.step >= x0 && f.step <= x1).map((f) => `
    <line class="fired" x1="${X(f.step)}" x2="${X(f.step)}" y1="${pad / 2}" y2="${height - pad}"><title>${esc(f.line)}</title></line>
    <text x="${X(f.step) + 2}" y="${pad / 2 + 8}" class="firing">${esc(f.monitor)}</text>`).join("");
  return `<svg class="chart" width="${width}" height="${height}" data-metric="${esc(name)}">
    <text x="${pad}" y="12">${esc(name)}</text>
    <text x="2" y="${Y(y1) + 4}">${fmt(y1, 3)}</text><text x="2" y="${Y(y0)}">${fmt(y0, 3)}</text>
    <text x="${X(x0)}" y="${height - 8}">step ${x0}</text><text x="${X(x1) - 30}" y="${height - 8}">${x1}</text>
    <polyline class="line" points="${line}"/>${marks}</svg>`;
}

async function renderCurves() {
  const body = await getJSON("/api/metrics");
  const picked = [...document.querySelectorAll("#metric-picks input:checked")].map((i) => i.value);
  $("charts").innerHTML = picked.map((name) => chart(name, body.series[name] || [], body.firings)).join("");
}

function fillMetricPicks(names) {
  const common = names.filter((n) => /^(reward|val|rollout|actor|monitor)\//.test(n));
  $("metric-picks").innerHTML = "<legend>Metrics</legend>" + common.map((n) => `
    <label><input type="checkbox" value="${esc(n)}" ${DEFAULT_CURVES.includes(n) ? "checked" : ""}>${esc(n)}</label>`).join("");
  for (const box of document.querySelectorAll("#metric-picks input")) box.addEventListener("change", renderCurves);
}

// ---- start --------------------------------------------------------------------------------------------
async function start() {
  state.run = await getJSON("/api/run");
  $("run-name").textContent = state.run.run;
  $("filter-monitor").innerHTML = `<option value="any">any step</option>` + state.run.firings.map((f) =>
    `<option value="${esc(f.monitor)}">${esc(f.monitor)} (fired at step ${f.step})</option>`).join("");
  fillMetricPicks(state.run.metrics);
  for (const tab of document.querySelectorAll(".tab")) {
    tab.addEventListener("click", () => {
      for (const other of document.querySelectorAll(".tab")) other.classList.toggle("active", other === tab);
      for (const panel of document.querySelectorAll(".panel")) panel.classList.toggle("hidden", panel.id !== tab.dataset.panel);
      if (tab.dataset.panel === "curves") renderCurves();
    });
  }
  $("dump").addEventListener("change", (e) => loadDump(e.target.value));
  $("filter-monitor").addEventListener("change", fillDumps);
  for (const id of ["filter-reward", "filter-finish", "filter-searches"]) $(id).addEventListener("change", renderList);
  fillDumps();
}

start().catch((error) => {
  $("detail").innerHTML = `<p class="firing">${esc(error.message)}</p>`;
  console.error(error);
});
