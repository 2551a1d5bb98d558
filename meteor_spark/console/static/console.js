// meteor console: polls the console's own JSON endpoints and redraws tables and the lag chart.
// No libraries, nothing fetched from elsewhere: the page works offline.
"use strict";

const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"];
const MAX_TAIL_ROWS = 500;

function el(tag, attrs, text) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

function svg(tag, attrs, text) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = String(text);
  return node;
}

function num(v) { return v === null || v === undefined ? "-" : Number(v).toLocaleString("en-US", {maximumFractionDigits: 1}); }
function when(ms) { return ms === null || ms === undefined ? "-" : new Date(ms).toISOString().replace("T", " ").slice(0, 19); }
function age(ms) {
  if (ms === null || ms === undefined) return "-";
  const s = ms / 1000;
  for (const [unit, size] of [["d", 86400], ["h", 3600], ["min", 60]]) if (s >= size) return (s / size).toFixed(1) + " " + unit;
  return s.toFixed(0) + " s";
}
function status(text) { document.getElementById("status").textContent = text || ""; }

async function getJson(url) {
  const response = await fetch(url, {credentials: "same-origin"});
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

// Runs `step` now and every `ms`; a failure shows in the status line and the polling goes on.
function every(ms, step) {
  const run = async () => {
    try { await step(); status(""); } catch (e) { status("refresh failed: " + e.message); }
    setTimeout(run, ms);
  };
  run();
}

function fillRows(tbody, rows) {
  tbody.replaceChildren(...rows.map(cells => {
    const tr = el("tr");
    for (const cell of cells) {
      const td = el("td");
      if (cell instanceof Node) td.appendChild(cell); else td.textContent = cell;
      tr.appendChild(td);
    }
    return tr;
  }));
}

function link(href, text) { return el("a", {href}, text); }
function seg(...parts) { return "/" + parts.map(encodeURIComponent).join("/"); }

function table(headers, rows) {
  const t = el("table");
  const tr = el("tr");
  for (const h of headers) tr.appendChild(el("th", {}, h));
  t.appendChild(el("thead")).appendChild(tr);
  fillRows(t.appendChild(el("tbody")), rows);
  return t;
}

const pages = {
  streams() {
    const api = document.body.dataset.api;
    every(3000, async () => {
      const streams = await getJson(api);
      fillRows(document.getElementById("streams"), streams.map(s => [
        link(seg("streams", s.name), s.name), num(s.lane_count), num(s.capacity), num(s.held), num(s.rate),
        age(s.depth_ms), when(s.created_ms)]));
    });
  },

  groups() {
    const api = document.body.dataset.api;
    every(3000, async () => {
      const groups = await getJson(api);
      fillRows(document.getElementById("groups"), groups.map(g => [
        link(seg("streams", g.stream), g.stream), link(seg("groups", g.stream, g.group), g.group), g.kind,
        num(g.members), num(g.held)]));
    });
  },

  group() {
    const api = document.body.dataset.api;
    every(2000, async () => {
      const view = await getJson(api);
      drawChart(document.getElementById("lag-chart"), view.history);
      if (view.kind === "shared") {
        document.getElementById("lanes").replaceChildren(table(
          ["lane", "start offset", "never acquired from", "acquired ranges", "to redeliver", "acquisitions"],
          view.lanes.map(l => [l.lane, num(l.start), num(l.next), num(l.acquired_ranges), num(l.available_ranges),
                               num(l.acquisitions)])));
      } else {
        document.getElementById("lanes").replaceChildren(table(
          ["lane", "holder", "epoch", "lease expires", "confirmed offset", "records behind", "items behind", "lost items"],
          view.lanes.map(l => [l.lane, l.holder || "(free)", num(l.epoch), when(l.lease_expires_ms), num(l.confirmed),
                               l.past_end ? "PAST END" : num(l.records_behind), num(l.items_behind), num(l.lost_items)])));
      }
      document.getElementById("members").replaceChildren(table(
        ["member", "host", "pid", "last heartbeat"],
        view.members.map(m => [m.member, m.host, m.pid, when(m.renewed_ms)])));
    });
  },

  tail() {
    const api = document.body.dataset.api;
    const form = document.getElementById("tail-filter");
    const tbody = document.getElementById("tail");
    let cursor = "";
    let filter = new URLSearchParams();
    form.addEventListener("submit", event => {
      event.preventDefault();
      filter = new URLSearchParams();
      for (const [k, v] of new FormData(form)) if (v) filter.set(k, v);
      cursor = "";
      tbody.replaceChildren();
    });
    every(1000, async () => {
      const query = new URLSearchParams(filter);
      if (cursor) query.set("cursor", cursor);
      const answer = await getJson(api + "?" + query.toString());
      cursor = answer.cursor;
      for (const r of answer.records) {
        const tr = el("tr", {"data-offset": r.lane + ":" + r.offset});
        for (const cell of [r.lane + ":" + r.offset, when(r.timestamp_ms), r.key ?? "", r.topic, r.value ?? ""])
          tr.appendChild(el("td", {}, cell));
        tbody.insertBefore(tr, tbody.firstChild);
      }
      while (tbody.rows.length > MAX_TAIL_ROWS) tbody.deleteRow(-1);
      if (answer.dropped || answer.skipped_items)
        status(`${answer.dropped} record(s) past the page's bound, ${answer.skipped_items} item(s) gone or undecodable`);
    });
  },

  dlq() {
    const button = document.getElementById("redrive");
    if (!button) return;
    const refresh = async () => {
      const view = await getJson(document.body.dataset.api);
      const q = v => (v === null || v === undefined ? "?" : v);
      fillRows(document.getElementById("letters"), view.letters.map(d => [
        d.lane + ":" + d.offset, `${q(d.source)}:${q(d.source_lane)}:${q(d.source_offset)}`, d.group || "-",
        d.error || "", d.key || "", d.value || "", d.redriven ? "yes" : "no"]));
    };
    button.addEventListener("click", async () => {
      const out = document.getElementById("redrive-result");
      button.disabled = true;
      try {
        const response = await fetch(button.dataset.api, {method: "POST", credentials: "same-origin",
                                                          headers: {"X-Meteor-Action": "redrive"}});
        const body = await response.json();
        out.textContent = response.ok
          ? `redrove ${body.redriven}, ${body.already} redriven before, ${body.matched} matched`
          : `refused (${response.status}): ${body.error}`;
        if (response.ok) await refresh();
      } catch (e) { status("redrive failed: " + e.message); } finally { button.disabled = false; }
    });
  },
};

// The lag chart: one polyline per lane, x = time over the samples kept, y = ring items behind.
function drawChart(chart, history) {
  const W = 800, H = 260, L = 60, R = 10, T = 10, B = 30;
  const lanes = Object.keys(history);
  let t0 = Infinity, t1 = -Infinity, top = 1;
  for (const lane of lanes) for (const [t, v] of history[lane]) { t0 = Math.min(t0, t); t1 = Math.max(t1, t); top = Math.max(top, v); }
  const nodes = [svg("line", {x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: "#888"}),
                 svg("line", {x1: L, y1: T, x2: L, y2: H - B, stroke: "#888"}),
                 svg("text", {x: L - 6, y: T + 10, "text-anchor": "end", "font-size": 11}, num(top)),
                 svg("text", {x: L - 6, y: H - B, "text-anchor": "end", "font-size": 11}, "0")];
  if (lanes.length && t1 > t0) {
    nodes.push(svg("text", {x: L, y: H - 8, "font-size": 11}, when(t0).slice(11)));
    nodes.push(svg("text", {x: W - R, y: H - 8, "font-size": 11, "text-anchor": "end"}, when(t1).slice(11)));
  }
  const legend = document.getElementById("legend");
  legend.replaceChildren();
  const span = Math.max(1, t1 - t0);
  lanes.forEach((lane, i) => {
    const color = COLORS[i % COLORS.length];
    const points = history[lane].map(([t, v]) =>
      (L + (t - t0) / span * (W - L - R)).toFixed(1) + "," + (H - B - v / top * (H - T - B)).toFixed(1));
    const last = history[lane].length ? history[lane][history[lane].length - 1][1] : null;
    nodes.push(svg("polyline", {points: points.join(" "), fill: "none", stroke: color, "stroke-width": 2,
                                "data-lane": lane, "data-last": last === null ? "" : last}));
    const item = el("span");
    item.appendChild(el("i", {style: "background:" + color}));
    item.appendChild(document.createTextNode(`lane ${lane}: ${num(last)} behind`));
    legend.appendChild(item);
  });
  if (!lanes.length) nodes.push(svg("text", {x: W / 2, y: H / 2, "text-anchor": "middle", "font-size": 13},
                                    "no samples yet (a lane shows once the group has confirmed an offset on it)"));
  chart.replaceChildren(...nodes);
}

const page = pages[document.body.dataset.page];
if (page) page();
