// The console dashboard (observability/dashboard.py): polls the data route every 2 s,
// keeps one window of points per model in the page, and draws each chart as an SVG
// polyline per series. No library: a few charts of time against value need little.
"use strict";

(() => {
  const root = document.getElementById("dashboard");
  if (!root) return;

  const POLL_MS = 2000;
  const SVG_NS = "http://www.w3.org/2000/svg";
  const W = 320, H = 130, LEFT = 46, RIGHT = 8, TOP = 8, BOTTOM = 18;
  // One chart per entry: its series are [column, legend] pairs of the data route's columns.
  const MODEL_CHARTS = [
    { title: "Generated tokens/s", series: [["tokens_per_s", "tokens/s"]] },
    { title: "Time to first token (s)", series: [["ttft_p50", "p50"], ["ttft_p95", "p95"]] },
    { title: "Requests", series: [["waiting", "queued"], ["running", "running"]] },
    { title: "KV tokens", series: [["kv_used", "used"], ["kv_capacity", "capacity"]] },
  ];
  const SERVER_CHARTS = [
    { title: "Parked sessions", series: [["sessions_parked", "sessions"]] },
    { title: "Parked session bytes", series: [["sessions_parked_bytes", "bytes"]] },
  ];

  const points = { models: {}, server: { t: [] } };
  let since = 0;

  function el(tag, attrs = {}, ...children) {
    const svg = ["svg", "polyline", "line", "text", "rect"].includes(tag);
    const node = svg ? document.createElementNS(SVG_NS, tag) : document.createElement(tag);
    for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, value);
    for (const child of children) node.append(child);
    return node;
  }

  // New points onto what the page holds; points older than the window dropped.
  function merge(held, fresh, oldest) {
    const before = held.t.length; // a column new to the page is padded to the times held
    for (const [name, values] of Object.entries(fresh)) {
      (held[name] ||= new Array(before).fill(null)).push(...values);
    }
    let drop = 0;
    while (drop < held.t.length && held.t[drop] < oldest) drop++;
    if (drop) for (const column of Object.values(held)) column.splice(0, drop);
  }

  function niceMax(value) {
    if (!(value > 0)) return 1;
    const step = 10 ** Math.floor(Math.log10(value));
    return [1, 2, 2.5, 5, 10].map((m) => m * step).find((m) => m >= value);
  }

  function short(value) {
    if (value === null || value === undefined) return "–";
    const abs = Math.abs(value);
    if (abs >= 1e9) return (value / 1e9).toFixed(1) + "G";
    if (abs >= 1e6) return (value / 1e6).toFixed(1) + "M";
    if (abs >= 1e4) return (value / 1e3).toFixed(0) + "k";
    if (abs >= 100 || Number.isInteger(value)) return value.toFixed(0);
    return value.toFixed(abs >= 1 ? 1 : 3);
  }

  function ago(seconds) {
    return seconds < 120 ? `${Math.round(seconds)} s` : `${Math.round(seconds / 60)} min`;
  }

  // One chart: x from the first point held (at most the window back) to the server's now.
  function chart(spec, columns, now, windowS) {
    const t = columns.t;
    const t0 = t.length ? Math.max(t[0], now - windowS) : now - 60;
    const span = Math.max(now - t0, 1);
    let top = 0;
    for (const [name] of spec.series) {
      for (const v of columns[name] || []) if (v !== null && v > top) top = v;
    }
    top = niceMax(top);
    const x = (ti) => LEFT + ((ti - t0) / span) * (W - LEFT - RIGHT);
    const y = (v) => H - BOTTOM - (v / top) * (H - TOP - BOTTOM);

    const svg = el("svg", { viewBox: `0 0 ${W} ${H}`, class: "dash-chart", role: "img" });
    svg.append(
      el("line", { x1: LEFT, y1: TOP, x2: LEFT, y2: H - BOTTOM, class: "dash-axis" }),
      el("line", { x1: LEFT, y1: H - BOTTOM, x2: W - RIGHT, y2: H - BOTTOM, class: "dash-axis" }),
      el("line", { x1: LEFT, y1: TOP, x2: W - RIGHT, y2: TOP, class: "dash-grid" }),
      el("text", { x: LEFT - 4, y: TOP + 4, class: "dash-tick", "text-anchor": "end" }, short(top)),
      el("text", { x: LEFT - 4, y: H - BOTTOM, class: "dash-tick", "text-anchor": "end" }, "0"),
      el("text", { x: LEFT, y: H - 4, class: "dash-tick" }, `−${ago(span)}`),
      el("text", { x: W - RIGHT, y: H - 4, class: "dash-tick", "text-anchor": "end" }, "now"),
    );
    const legend = el("span", { class: "dash-legend" });
    spec.series.forEach(([name, label], i) => {
      const values = columns[name] || [];
      // A gap (null: nothing measured, e.g. no first token in the last minute) splits the line.
      let run = [];
      const flush = () => {
        if (run.length) {
          svg.append(el("polyline", { points: run.join(" "), class: `dash-line s${i}`, "data-series": name }));
        }
        run = [];
      };
      values.forEach((v, k) => {
        if (v === null || t[k] < t0) flush();
        else run.push(`${x(t[k]).toFixed(1)},${y(v).toFixed(1)}`);
      });
      flush();
      const latest = values.length ? values[values.length - 1] : null;
      legend.append(el("span", { class: `dash-key s${i}` }, `${label} ${short(latest)}`));
    });
    return el("figure", { class: "dash-figure" }, el("figcaption", {}, spec.title, legend), svg);
  }

  function progressBar(progress) {
    const fraction = Math.max(0, Math.min(1, progress.fraction || 0));
    const detail = `${progress.phase || "loading"}: ${progress.tensors_done}/${progress.tensors_total} tensors, ` +
      `${short(progress.bytes_done)}B/${short(progress.bytes_total)}B (${Math.round(fraction * 100)}%)`;
    return el("div", { class: "dash-progress-row" },
      el("progress", { class: "dash-progress", max: "1", value: String(fraction) }),
      el("span", { class: "dash-progress-text" }, detail));
  }

  function modelCard(row, now, windowS) {
    const meta = [];
    if (row.in_flight !== undefined) meta.push(`in flight ${row.in_flight}`);
    if (row.memory_bytes) meta.push(`${short(row.memory_bytes)}B`);
    const card = el("section", { class: "dash-model", "data-model": row.name },
      el("h3", {}, row.name, " ",
        el("span", { class: `dash-state state-${row.state.replace(/\s+/g, "-")}` }, row.state),
        " ", el("span", { class: "dash-meta" }, meta.join(" · "))));
    if (row.error) card.append(el("p", { class: "dash-error" }, row.error));
    if (row.progress) card.append(progressBar(row.progress));
    const columns = points.models[row.name];
    if (columns && columns.t.length) {
      card.append(el("div", { class: "dash-charts" },
        ...MODEL_CHARTS.map((spec) => chart(spec, columns, now, windowS))));
    } else if (row.state !== "loading") {
      card.append(el("p", { class: "dash-empty" }, "No points yet."));
    }
    return card;
  }

  function usageTable(usage) {
    if (!usage || !usage.rows.length) return el("p", { class: "dash-empty" }, "No requests in this period.");
    const cells = ["key", "model", "requests", "prompt_tokens", "cached_tokens", "generated_tokens", "errors"];
    const head = el("tr", {}, ...["Key", "Model", "Requests", "Prompt tokens", "Cached", "Generated", "Errors"]
      .map((h) => el("th", { scope: "col" }, h)));
    const body = usage.rows.map((r) => el("tr", {}, ...cells.map((c) => el("td", {}, String(r[c] ?? "")))));
    return el("div", {}, el("p", { class: "dash-meta" }, usage.period),
      el("table", { class: "dash-usage" }, el("thead", {}, head), el("tbody", {}, ...body)));
  }

  function render(data) {
    const models = root.querySelector("#dashboard-models");
    models.replaceChildren(...data.models.map((row) => modelCard(row, data.now, data.window_s)));
    if (!data.models.length) models.append(el("p", { class: "dash-empty" }, "No model is loaded."));
    root.querySelector("#dashboard-server").replaceChildren(
      ...SERVER_CHARTS.map((spec) => chart(spec, points.server, data.now, data.window_s)));
    root.querySelector("#dashboard-usage").replaceChildren(usageTable(data.usage));
    const note = data.sampling ? "" : " (the sampler is not running in this process: no series)";
    status(`Updated ${new Date(data.now * 1000).toLocaleTimeString()}${note}`);
  }

  function status(text) {
    root.querySelector("#dashboard-status").textContent = text;
  }

  async function poll() {
    try {
      const response = await fetch(`${root.dataset.url}?since=${since}`, {
        credentials: "same-origin",
        headers: { Accept: "application/json" },
      });
      const type = response.headers.get("Content-Type") || "";
      if (!type.startsWith("application/json")) throw new Error("signed out? reload the page");
      const data = await response.json();
      if (!response.ok) throw new Error(data.error ? data.error.message : response.status);
      const oldest = data.now - data.window_s;
      const live = new Set();
      for (const row of data.models) {
        live.add(row.name);
        merge((points.models[row.name] ||= { t: [] }), row.series, oldest);
      }
      for (const name of Object.keys(points.models)) if (!live.has(name)) delete points.models[name];
      merge(points.server, data.server, oldest);
      for (const columns of [points.server, ...Object.values(points.models)]) {
        if (columns.t.length) since = Math.max(since, columns.t[columns.t.length - 1]);
      }
      render(data);
    } catch (error) {
      status(`Dashboard not updated: ${error.message}`);
    } finally {
      setTimeout(poll, POLL_MS);
    }
  }

  poll();
})();
