// attnlab inspect: draws the page from the JSON in <script id="data"> (no network, no library).
"use strict";
const DATA = JSON.parse(document.getElementById("data").textContent);
const tip = document.getElementById("tip");
const root = document.getElementById("root");

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else e.setAttribute(k, v);
  }
  for (const c of kids) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}
function viridis(t) {  // a short viridis ramp, t in [0, 1]
  const s = [[68,1,84],[59,82,139],[33,145,140],[94,201,98],[253,231,37]];
  t = Math.min(1, Math.max(0, t)) * (s.length - 1);
  const i = Math.min(s.length - 2, Math.floor(t)), f = t - i;
  return s[i].map((a, j) => Math.round(a + f * (s[i + 1][j] - a)));
}
function diverging(t) {  // t in [-1, 1]: blue - white - red
  t = Math.min(1, Math.max(-1, t));
  return t < 0 ? [Math.round(255 * (1 + t)), Math.round(255 * (1 + t)), 255]
               : [255, Math.round(255 * (1 - t)), Math.round(255 * (1 - t))];
}
function mean(xs) { const v = xs.filter((x) => x !== null); return v.length ? v.reduce((a, b) => a + b, 0) / v.length : null; }
// JSON holds no NaN or infinity: the page data writes them "NaN", "Infinity", "-Infinity"
function num(x) { return typeof x === "string" ? Number(x) : x; }
function nums(x) { return Array.isArray(x) ? x.map(nums) : num(x); }
function readNumbers(cap) {  // every number of a capture as a JS number (NaN and ±Infinity too)
  cap.loss = cap.loss.map(num);
  cap.top = cap.top.map((row) => row.map(([w, p]) => [w, num(p)]));
  for (const lv of cap.layers) for (const k of Object.keys(lv.earlier)) lv.earlier[k] = nums(lv.earlier[k]);
  for (const p of cap.parts) {
    for (const t of Object.values(p.tokens)) t.data = nums(t.data);
    for (const k of Object.keys(p.summary)) p.summary[k] = nums(p.summary[k]);
    for (const k of Object.keys(p.numbers)) p.numbers[k] = num(p.numbers[k]);
  }
}
const finite = Number.isFinite;
const NONFINITE = [255, 0, 255];  // magenta: NaN or infinite
function fmt(x) { return x === null || x === undefined ? "—" : Number(x).toFixed(3); }

// A heatmap panel: value(i, j) for i < rows, j < cols; labels for hover.
function heatmap(kind, title, rows, cols, value, opts) {
  const o = Object.assign({scale: 1, signed: false, rowLabels: [], colLabels: [], what: ""}, opts);
  const cell = Math.max(1, Math.min(8, Math.floor(240 / Math.max(cols, 1))));
  const c = el("canvas", {width: cols * cell, height: rows * cell});
  const ctx = c.getContext("2d");
  const img = ctx.createImageData(cols * cell, rows * cell);
  for (let i = 0; i < rows; i++) for (let j = 0; j < cols; j++) {
    const v = value(i, j);
    const rgb = v === null ? [235, 235, 235] : !finite(v) ? NONFINITE
      : (o.signed ? diverging(v / o.scale) : viridis(Math.sqrt(Math.max(0, v) / o.scale)));
    for (let y = 0; y < cell; y++) for (let x = 0; x < cell; x++) {
      const p = ((i * cell + y) * cols * cell + j * cell + x) * 4;
      img.data[p] = rgb[0]; img.data[p + 1] = rgb[1]; img.data[p + 2] = rgb[2]; img.data[p + 3] = 255;
    }
  }
  ctx.putImageData(img, 0, 0);
  c.addEventListener("mousemove", (ev) => {
    const r = c.getBoundingClientRect();
    const j = Math.floor((ev.clientX - r.left) / cell), i = Math.floor((ev.clientY - r.top) / cell);
    if (i < 0 || j < 0 || i >= rows || j >= cols) return;
    const v = value(i, j);
    tip.textContent = `${o.rowLabels[i] ?? i} → ${o.colLabels[j] ?? j}\n${o.what}${v === null ? "masked" : fmt(v)}`;
    tip.style.left = (ev.clientX + 12) + "px"; tip.style.top = (ev.clientY + 12) + "px";
    tip.style.display = "block";
  });
  c.addEventListener("mouseleave", () => { tip.style.display = "none"; });
  return el("div", {class: "panel", "data-kind": kind}, el("div", {class: "title"}, title), c);
}

function labels(cap) { return cap.tokens.map((t, i) => `${cap.start + i} '${t}'`); }
function mapValue(m, h, n) { return (i, j) => { const v = m.data[(h * n + i) * n + j]; return typeof v === "string" ? Number(v) : v / 1000; }; }

function predictions(cap) {
  const t = el("table", {class: "preds"},
    el("tr", {}, el("th", {}, "pos"), el("th", {}, "token"), el("th", {}, `loss (${cap.predicts})`),
       el("th", {}, "top predictions")));
  const maxLoss = Math.max(1e-9, ...cap.loss.filter((x) => x !== null && finite(x)));
  cap.tokens.forEach((tok, i) => {
    const l = cap.loss[i];
    const bar = el("span", {class: "bar", style: `width:${l === null || !finite(l) ? 0 : Math.round(80 * l / maxLoss)}px`});
    t.append(el("tr", {}, el("td", {}, cap.start + i), el("td", {}, el("span", {class: "tok"}, tok)),
      el("td", {}, bar, " ", fmt(l)),
      el("td", {}, cap.top[i].map(([w, p]) => `'${w}' ${(100 * p).toFixed(1)}%`).join("  "))));
  });
  return el("div", {class: "panel", "data-kind": "predictions"},
    el("div", {class: "title"}, `${cap.name}: per-token loss and top predictions`), t);
}

function runHeader(cap) {
  const box = el("div", {},
    el("h3", {}, `${cap.name}`),
    el("div", {class: "meta"}, `${cap.target} — ${cap.kind} model, family ${cap.family}; ` +
       `${cap.n_tokens} tokens, positions ${cap.start}..${cap.n_tokens - 1} shown`));
  for (const n of cap.notes) box.append(el("div", {class: "note"}, n));
  return box;
}

function render() {
  const caps = DATA.captures;
  caps.forEach(readNumbers);
  root.append(el("h1", {}, DATA.title));
  for (const n of DATA.notes) root.append(el("div", {class: "note"}, n));
  caps.forEach((c) => root.append(runHeader(c)));
  const same = caps.length === 2 && DATA.same_tokens;

  root.append(el("h2", {}, "Mask"));
  const mrow = el("div", {class: "row"});
  caps.forEach((c) => {
    if (!c.mask) return;
    const n = c.tokens.length;
    mrow.append(heatmap("mask", `${c.name}: mask (${c.mask_name}); bright = may attend`, n, n,
      (i, j) => c.mask[i][j] === "1" ? 1 : 0, {rowLabels: labels(c), colLabels: labels(c), what: "allowed "}));
  });
  root.append(mrow);

  root.append(el("h2", {}, "Attention by layer and head"));
  root.append(el("div", {class: "meta"}, "Rows: queries, columns: keys; colour: sqrt of the " +
    "probability; hover for the value." + (same ? " Difference: " + caps[1].name + " − " + caps[0].name + "." : "")));
  const nLayers = Math.max(...caps.map((c) => c.layers.length));
  for (let l = 0; l < nLayers; l++) {
    const det = el("details", {open: ""}, el("summary", {}, caps.map((c) => c.layers[l] ? c.layers[l].name : "—").join("  |  ")));
    const keys = [...new Set(caps.flatMap((c) => c.layers[l] ? Object.keys(c.layers[l].maps) : []))];
    for (const key of keys) {
      const vals = caps.map(() => []);
      caps.forEach((c, r) => {
        const lv = c.layers[l]; const m = lv && lv.maps[key];
        if (!m) return;
        const n = c.tokens.length;
        const row = el("div", {class: "row"});
        for (let h = 0; h < m.heads; h++) {
          const f = mapValue(m, h, n);
          vals[r].push(f);
          const early = c.start ? ` (earlier keys: ${fmt(lv.earlier[key][h])})` : "";
          row.append(heatmap("attention", `${c.name} · head ${h}${early}`, n, n,
            (i, j) => c.mask && c.mask[i][j] === "0" ? null : f(i, j),
            {rowLabels: labels(c), colLabels: labels(c), what: "p = "}));
        }
        det.append(el("h3", {}, `${c.name} · ${lv.name} · ${key}`), row);
      });
      if (same && vals[0].length && vals[0].length === vals[1].length) {
        const n = caps[0].tokens.length;
        const row = el("div", {class: "row"});
        vals[0].forEach((f0, h) => {
          const f1 = vals[1][h];
          let scale = 1e-6;
          for (let i = 0; i < n; i++) for (let j = 0; j < n; j++) {
            const d = Math.abs(f1(i, j) - f0(i, j));
            if (finite(d)) scale = Math.max(scale, d);
          }
          row.append(heatmap("difference", `head ${h} (max |Δ| ${fmt(scale)})`, n, n,
            (i, j) => f1(i, j) - f0(i, j),
            {signed: true, scale: scale, rowLabels: labels(caps[0]), colLabels: labels(caps[0]), what: "Δp = "}));
        });
        det.append(el("h3", {}, `difference ${caps[1].name} − ${caps[0].name} · ${key}`), row);
      }
    }
    root.append(det);
  }

  root.append(el("h2", {}, "Per-token loss and top predictions"));
  const prow = el("div", {class: "row"});
  caps.forEach((c) => prow.append(predictions(c)));
  root.append(el("details", {}, el("summary", {}, "show the table (" + caps.map((c) => `${c.name}: mean loss ${fmt(mean(c.loss))}`).join(", ") + ")"), prow));

  root.append(el("h2", {}, "What each part shows"));
  const any = caps.some((c) => c.parts.length);
  if (!any) root.append(el("div", {class: "meta"}, "No part of these models declares token statistics, forward statistics or layer statistics."));
  caps.forEach((c) => {
    if (!c.parts.length) return;
    root.append(el("h3", {}, c.name));
    const row = el("div", {class: "row"});
    for (const p of c.parts) {
      for (const [key, t] of Object.entries(p.tokens)) {
        const doc = p.docs[key] || [key, null];
        const n = t.data.length, m = t.data[0].length;
        const tail = doc[1] || [];
        const cols = Array.from({length: m}, (_, j) => j >= m - tail.length ? tail[j - (m - tail.length)] : `${j}`);
        const scale = Math.max(1e-9, ...t.data.flat().map(Math.abs).filter(finite));
        row.append(heatmap("part", `${p.name} (${p.kind}): ${doc[0]}`, n, m, (i, j) => t.data[i][j],
          {scale: scale, rowLabels: labels(c), colLabels: cols, what: `${key} = `}));
      }
      const extra = [];
      for (const [key, v] of Object.entries(p.summary)) {
        const doc = p.docs[key] || [key, null];
        extra.push(el("div", {}, `${doc[0]}: ` + v.map((x) => fmt(x)).join(", ")));
      }
      for (const [key, v] of Object.entries(p.numbers)) {
        extra.push(el("div", {}, `${key} = ${fmt(v)}`));
      }
      if (extra.length) row.append(el("div", {class: "panel", "data-kind": "part-numbers"},
        el("div", {class: "title"}, `${p.name} (${p.kind})`), ...extra));
    }
    root.append(row);
  });
  const panels = [...document.querySelectorAll(".panel")];
  document.body.setAttribute("data-panels", String(panels.length));
  document.body.setAttribute("data-visible-panels", String(panels.filter((p) => (p.checkVisibility ? p.checkVisibility() : p.offsetParent !== null)).length));
  document.body.setAttribute("data-rendered", "yes");
}
render();
