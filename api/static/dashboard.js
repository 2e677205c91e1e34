// tuner dashboard: reads the JSON API, draws Optuna's plotly figures, refreshes on the study's event stream.
"use strict";
const $ = (id) => document.getElementById(id);
let current = null, source = null, lastEventId = 0, refreshTimer = null, trialsOffset = 0;
const PAGE = 50;

async function getJSON(url) {
  const r = await fetch(url);
  if (!r.ok) throw new Error(url + " -> " + r.status);
  return r.json();
}
function cell(tr, text, cls) {
  const td = document.createElement("td");
  td.textContent = text === null || text === undefined ? "" : String(text);
  if (cls) td.className = cls;
  tr.appendChild(td);
}
function fmt(x, d = 3) {
  if (x === null || x === undefined) return "";
  const v = Number(x);
  return Math.abs(v) >= 10 ** (d + 1) ? v.toFixed(0) : String(Number(v.toPrecision(d + 1)));
}

function renderStudies(studies) {
  const body = $("studies").tBodies[0];
  body.replaceChildren();
  const sel = $("study-select");
  sel.replaceChildren();
  for (const s of studies) {
    const tr = document.createElement("tr");
    tr.className = "study-row";
    [s.name, s.state, s.target, fmt(s.budget_s), fmt(s.elapsed_s), s.n_trials,
     Object.entries(s.trials_by_outcome).map(([k, v]) => k + ": " + v).join(", "),
     fmt(s.best_value), s.speedup_vs_baseline ? fmt(s.speedup_vs_baseline, 2) + "×" : ""].forEach((v) => cell(tr, v));
    tr.onclick = () => select(s.name);
    body.appendChild(tr);
    const opt = document.createElement("option");
    opt.value = opt.textContent = s.name;
    sel.appendChild(opt);
  }
  if (current) sel.value = current;
}

function renderTrials(page, bestNumber) {
  const first = page.items.length ? page.offset + 1 : 0;
  $("trials-count").textContent = "(" + first + "–" + (page.offset + page.items.length) + " of " + page.total +
    ", newest first)";
  $("trials-newer").disabled = page.offset === 0;
  $("trials-older").disabled = page.offset + page.items.length >= page.total;
  const body = $("trials").tBodies[0];
  body.replaceChildren();
  for (const t of page.items) {
    const tr = document.createElement("tr");
    tr.className = "trial-row" + (t.number === bestNumber ? " best" : "") + (t.state === "failed" ? " failed" : "");
    [t.number + (t.is_baseline ? " (baseline)" : ""), t.state, t.outcome, fmt(t.value), fmt(t.duration_s, 2)]
      .forEach((v) => cell(tr, v));
    cell(tr, JSON.stringify(t.params), "params");
    cell(tr, t.reason);
    body.appendChild(tr);
  }
}

async function drawFigure(div, url) {
  const fig = await getJSON(url);
  const layout = Object.assign({}, fig.layout, { margin: { t: 40, l: 50, r: 10, b: 40 }, autosize: true });
  await Plotly.react($(div), fig.data || [], layout, { displaylogo: false, responsive: true });
}

async function drawFront(base) {
  // a goodput study's front (404 for any other study: the section stays hidden)
  const r = await fetch(base + "/plots/front");
  if (!r.ok) { $("front-section").hidden = true; return; }
  const fig = await r.json();
  $("front-section").hidden = false;
  const layout = Object.assign({}, fig.layout, { margin: { t: 40, l: 60, r: 10, b: 60 }, autosize: true });
  await Plotly.react($("plot-front"), fig.data || [], layout, { displaylogo: false, responsive: true });
  const m = fig.meta || {};
  $("front-note").textContent = (m.best ? "best within the SLO: " + m.best : "no measured load met the SLO") +
    "; front: " + (m.front || []).join(", ");
}

async function refresh() {
  const studies = await getJSON("/api/studies");
  if (!current && studies.length) current = new URLSearchParams(location.search).get("study") || studies[0].name;
  renderStudies(studies);
  if (!current) return;
  const base = "/api/studies/" + encodeURIComponent(current);
  const study = await getJSON(base);
  const page = await getJSON(base + "/trials?sort=number&order=desc&limit=" + PAGE + "&offset=" + trialsOffset);
  renderTrials(page, study.best_trial_number);
  const jobs = [drawFigure("plot-history", base + "/plots/history"),
                drawFigure("plot-importances", base + "/plots/importances"),
                getJSON(base + "/importances").then((imp) => { $("importances-reason").textContent = imp.reason; }),
                drawFront(base)];
  if (study.best_trial_number !== null) {
    jobs.push(getJSON(base + "/best").then((best) => {
      $("best-summary").textContent = "trial " + best.trial.number + ": " + fmt(best.value) + " " + study.unit +
        (best.speedup_vs_baseline ? " (" + fmt(best.speedup_vs_baseline, 2) + "× baseline)" : "");
      $("best-why").textContent = best.why;
      $("best-params").textContent = JSON.stringify(best.trial.params, null, 2);
      $("launch-script").textContent = best.launch_script || "not exported yet";
    }));
  }
  await Promise.allSettled(jobs);
  if (study.state === "running") listen(base); else stopListening();
}

function scheduleRefresh() {
  if (refreshTimer) return;
  refreshTimer = setTimeout(() => { refreshTimer = null; refresh().catch(console.error); }, 1000);
}
function stopListening() {
  if (source) { source.close(); source = null; }
  $("live").textContent = "idle"; $("live").className = "live off";
}
function listen(base) {
  if (source) return;
  source = new EventSource(base + "/events?after=" + lastEventId);
  $("live").textContent = "live"; $("live").className = "live on";
  const kinds = ["trial_started", "trial_finished", "trial_pruned", "trial_failed", "new_best", "stage_started",
    "search_ended"];
  for (const k of kinds) {
    source.addEventListener(k, (e) => {
      lastEventId = Math.max(lastEventId, Number(e.lastEventId) || 0);
      scheduleRefresh();  // the refresh reads the study's state: a resumed study's old search_ended does not stop it
    });
  }
  source.onerror = () => { if (source && source.readyState === EventSource.CLOSED) stopListening(); };
}
function select(name) {
  stopListening();
  current = name; lastEventId = 0; trialsOffset = 0;
  refresh().catch(console.error);
}
$("study-select").onchange = (e) => select(e.target.value);
$("trials-newer").onclick = () => { trialsOffset = Math.max(0, trialsOffset - PAGE); refresh().catch(console.error); };
$("trials-older").onclick = () => { trialsOffset += PAGE; refresh().catch(console.error); };
refresh().catch((e) => { $("best-summary").textContent = "cannot load: " + e.message; });
