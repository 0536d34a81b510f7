// The lineage page: draws the graph that mgit laid out (nodes placed, edges routed), with
// pan (drag), zoom (wheel, buttons, + - 0 keys), a search box, and a side panel for the
// clicked model. Every user-given string goes into the page as text (textContent or an
// attribute value), never as markup.
"use strict";
(function () {
  const SVG = "http://www.w3.org/2000/svg";
  const data = JSON.parse(document.getElementById("mgit-data").textContent);
  const COLORS = { finetune: "#2b6cb0", adapter: "#2f855a", quantize: "#b7791f", prune: "#c05621",
                   distill: "#6b46c1", merge: "#c53030", other: "#718096" };
  const svg = document.getElementById("graph");
  const viewport = document.getElementById("viewport");
  const panel = document.getElementById("panel");
  const body = document.getElementById("panel-body");
  const search = document.getElementById("search");
  const nodeEls = new Map();   // name -> <g>
  const byName = new Map();    // name -> node data
  const parentsOf = new Map(); // name -> [edge]
  const childrenOf = new Map();
  const edgeEls = [];
  const view = { x: 0, y: 0, k: 1 };
  let selected = null;

  function el(tag, attrs, text) {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function h(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function size(n) {
    if (n === null || n === undefined) return "-";
    let v = n;
    for (const unit of ["B", "KiB", "MiB", "GiB"]) {
      if (Math.abs(v) < 1024) return unit === "B" ? `${v.toFixed(0)} B` : `${v.toFixed(1)} ${unit}`;
      v /= 1024;
    }
    return `${v.toFixed(1)} TiB`;
  }
  const short = (id) => (id ? id.slice(0, 12) : "-");
  const when = (t) => (t || "").slice(0, 16).replace("T", " ");
  const color = (rel) => COLORS[rel] || COLORS.other;
  const push = (map, key, value) => { if (!map.has(key)) map.set(key, []); map.get(key).push(value); };

  // --- drawing ---------------------------------------------------------------------------
  function path(points) {
    let d = `M${points[0][0]},${points[0][1]}`;
    for (let i = 1; i < points.length; i++) {
      const [x0, y0] = points[i - 1], [x1, y1] = points[i];
      const dx = Math.max(Math.abs(x1 - x0) / 2, 30);
      d += ` C${x0 + dx},${y0} ${x1 - dx},${y1} ${x1},${y1}`;
    }
    return d;
  }

  function draw() {
    const markers = document.getElementById("markers");
    const relations = [...new Set(data.edges.map((e) => e.relation))];
    relations.forEach((rel, i) => {
      const m = el("marker", { id: `arrow-${i}`, viewBox: "0 0 10 10", refX: "10", refY: "5",
                               markerWidth: "9", markerHeight: "9", markerUnits: "userSpaceOnUse",
                               orient: "auto-start-reverse" });
      m.appendChild(el("path", { d: "M0,0 L10,5 L0,10 z", fill: color(rel) }));
      markers.appendChild(m);
    });
    const edgesG = document.getElementById("edges");
    for (const e of data.edges) {
      const p = el("path", { class: "edge", d: path(e.points), stroke: color(e.relation),
                             "marker-end": `url(#arrow-${relations.indexOf(e.relation)})`,
                             "data-parent": e.parent, "data-child": e.child, "data-relation": e.relation });
      if (e.stale) p.setAttribute("data-stale", "");
      const stale = e.stale ? `, stale: ${e.parent} is now at @${e.latest_seq}` : "";
      p.appendChild(el("title", {}, `${e.parent}@${e.parent_seq} -> ${e.child} (${e.relation}${stale})`));
      edgesG.appendChild(p);
      edgeEls.push(p);
      push(parentsOf, e.child, e);
      push(childrenOf, e.parent, e);
    }
    const nodesG = document.getElementById("nodes");
    const names = document.getElementById("names");
    for (const n of data.nodes) {
      byName.set(n.name, n);
      const g = el("g", { class: "node", transform: `translate(${n.x},${n.y})`, "data-model": n.name,
                          "data-seq": String(n.seq), tabindex: "0" });
      if (n.removed) g.setAttribute("data-removed", "");
      if (n.lossy) g.setAttribute("data-lossy", "");
      g.appendChild(el("rect", { width: n.w, height: n.h, rx: "6" }));
      g.appendChild(el("text", { x: "10", y: "16", class: "name" }, n.label));
      g.appendChild(el("text", { x: "10", y: "31", class: "sub" }, n.sub));
      g.appendChild(el("title", {}, n.name));
      nodesG.appendChild(g);
      nodeEls.set(n.name, g);
      const opt = document.createElement("option");
      opt.value = n.name;
      names.appendChild(opt);
    }
    const stale = data.edges.filter((e) => e.stale).length;
    document.getElementById("counts").textContent =
      `${data.nodes.length} models, ${data.edges.length} edges` + (stale ? `, ${stale} stale` : "");
    legend(relations);
  }

  function legend(relations) {
    const box = document.getElementById("legend");
    for (const rel of relations) {
      const s = h("span");
      const i = h("i");
      i.style.borderTopColor = color(rel);
      s.append(i, rel);
      box.appendChild(s);
    }
    const stale = h("span");
    stale.append(h("i", "dash"), "stale (parent has newer versions)");
    box.append(stale, h("span", null, "dashed box: removed model"), h("span", null, "gold border: lossy"));
  }

  // --- pan and zoom ----------------------------------------------------------------------
  function apply() {
    viewport.setAttribute("transform", `translate(${view.x.toFixed(2)},${view.y.toFixed(2)}) scale(${view.k.toFixed(4)})`);
  }
  function zoomAt(factor, cx, cy) {
    const k = Math.min(4, Math.max(0.02, view.k * factor));
    view.x = cx - ((cx - view.x) * k) / view.k;
    view.y = cy - ((cy - view.y) * k) / view.k;
    view.k = k;
    apply();
  }
  function fit(readable) {
    // The whole graph in the part of the view that the panel leaves free; with `readable`
    // (on load), a large graph starts at its roots at a scale where labels can be read.
    const r = svg.getBoundingClientRect();
    const free = Math.max(r.width - (panel.hidden ? 0 : panel.offsetWidth), 100);
    const w = Math.max(data.width, 1), hgt = Math.max(data.height, 1);
    view.k = Math.min(1.5, Math.max(0.02, Math.min((free - 40) / w, (r.height - 40) / hgt)));
    view.x = (free - w * view.k) / 2;
    view.y = Math.max(20, (r.height - hgt * view.k) / 2);
    if (readable === true && view.k < 0.5) {
      view.k = 0.5;
      view.x = 20;
      view.y = Math.max(20, (r.height - hgt * view.k) / 2);
    }
    apply();
  }
  function centreOn(n) {
    const r = svg.getBoundingClientRect();
    view.k = Math.max(view.k, 0.8);
    view.x = r.width / 2 - (n.x + n.w / 2) * view.k - (panel.hidden ? 0 : panel.offsetWidth / 2);
    view.y = r.height / 2 - (n.y + n.h / 2) * view.k;
    apply();
  }

  let drag = null;
  svg.addEventListener("pointerdown", (ev) => {
    if (ev.button !== 0) return;
    drag = { x: ev.clientX, y: ev.clientY, vx: view.x, vy: view.y, moved: false,
             node: ev.target.closest ? ev.target.closest(".node") : null };
    svg.setPointerCapture(ev.pointerId);
  });
  svg.addEventListener("pointermove", (ev) => {
    if (!drag) return;
    const dx = ev.clientX - drag.x, dy = ev.clientY - drag.y;
    if (!drag.moved && Math.hypot(dx, dy) < 4) return;
    drag.moved = true;
    svg.classList.add("panning");
    view.x = drag.vx + dx;
    view.y = drag.vy + dy;
    apply();
  });
  function endDrag(ev) {
    if (!drag) return;
    const d = drag;
    drag = null;
    svg.classList.remove("panning");
    if (svg.hasPointerCapture(ev.pointerId)) svg.releasePointerCapture(ev.pointerId);
    if (!d.moved && ev.type === "pointerup") {
      if (d.node) select(d.node.getAttribute("data-model"));
      else select(null);
    }
  }
  svg.addEventListener("pointerup", endDrag);
  svg.addEventListener("pointercancel", endDrag);
  svg.addEventListener("wheel", (ev) => {
    ev.preventDefault();
    const r = svg.getBoundingClientRect();
    const delta = ev.deltaMode === 1 ? ev.deltaY * 16 : ev.deltaY;
    zoomAt(Math.exp(-delta * 0.0015), ev.clientX - r.left, ev.clientY - r.top);
  }, { passive: false });
  const centre = () => { const r = svg.getBoundingClientRect(); return [r.width / 2, r.height / 2]; };
  document.getElementById("zoom-in").addEventListener("click", () => zoomAt(1.25, ...centre()));
  document.getElementById("zoom-out").addEventListener("click", () => zoomAt(0.8, ...centre()));
  document.getElementById("fit").addEventListener("click", () => fit());
  document.addEventListener("keydown", (ev) => {
    if (ev.target === search) return;
    if (ev.key === "+" || ev.key === "=") zoomAt(1.25, ...centre());
    else if (ev.key === "-") zoomAt(0.8, ...centre());
    else if (ev.key === "0") fit();
    else if (ev.key === "Escape") select(null);
    else if (ev.key === "Enter" && ev.target.classList && ev.target.classList.contains("node")) {
      select(ev.target.getAttribute("data-model"));
    }
  });

  // --- search ----------------------------------------------------------------------------
  function matches(q) {
    q = q.trim().toLowerCase();
    if (!q) return [];
    return data.nodes.filter((n) => n.name.toLowerCase().includes(q)).map((n) => n.name);
  }
  search.addEventListener("input", () => {
    const found = new Set(matches(search.value));
    for (const [name, g] of nodeEls) g.classList.toggle("match", found.has(name));
    document.getElementById("found").textContent = search.value.trim() ? `${found.size} found` : "";
  });
  search.addEventListener("keydown", (ev) => {
    if (ev.key !== "Enter") return;
    const q = search.value.trim();
    const hit = byName.has(q) ? q : matches(q)[0];
    if (hit) { select(hit); centreOn(byName.get(hit)); }
  });

  // --- the panel -------------------------------------------------------------------------
  function select(name) {
    if (selected) nodeEls.get(selected).classList.remove("selected");
    for (const g of svg.querySelectorAll(".near")) g.classList.remove("near");
    selected = name && byName.has(name) ? name : null;
    svg.classList.toggle("focus", selected !== null);
    if (!selected) { panel.hidden = true; return; }
    nodeEls.get(selected).classList.add("selected");
    for (const p of edgeEls) {
      const parent = p.getAttribute("data-parent"), child = p.getAttribute("data-child");
      if (parent === selected || child === selected) {
        p.classList.add("near");
        nodeEls.get(parent === selected ? child : parent).classList.add("near");
      }
    }
    showPanel(byName.get(selected));
    keepVisible(byName.get(selected));
  }

  function keepVisible(n) {
    // A node hidden under the panel (or off screen) is brought into the free part of the view.
    const r = svg.getBoundingClientRect();
    const right = r.width - (panel.hidden ? 0 : panel.offsetWidth) - 20;
    const left = (n.x) * view.k + view.x, top = n.y * view.k + view.y;
    const w = n.w * view.k, hgt = n.h * view.k;
    if (left < 20 || left + w > right || top < 20 || top + hgt > r.height - 20) {
      view.x = Math.max(20, (right - w) / 2) - n.x * view.k;
      view.y = (r.height - hgt) / 2 - n.y * view.k;
      apply();
    }
  }

  function modelLink(name) {
    if (!byName.has(name)) return h("span", "mono", name);
    const b = h("button", "link", name);
    b.type = "button";
    b.addEventListener("click", () => select(name));
    return b;
  }
  function badge(text, cls) { return h("span", `badge ${cls || ""}`, text); }
  function row(table, cells, header) {
    const tr = h("tr");
    for (const [text, cls] of cells) tr.appendChild(h(header ? "th" : "td", cls || "", text));
    table.appendChild(tr);
    return tr;
  }
  function storageText(t) {
    if (!t || !Object.keys(t).length) return "-";
    return ["deduplicated", "delta", "derived", "standalone"].map((k) => `${t[k] || 0} ${k}`).join(", ");
  }
  function edgeItem(e, other, here) {
    const li = h("li");
    li.setAttribute(here === "parent" ? "data-child" : "data-parent", other);
    li.append(modelLink(other), " ");
    li.appendChild(badge(e.relation));
    const ref = h("span", "mono", here === "parent"
      ? ` its @${e.child_seq} from @${e.parent_seq} (${short(e.parent_version)})`
      : ` from ${e.parent}@${e.parent_seq} (${short(e.parent_version)})`);
    li.appendChild(ref);
    if (e.stale) li.append(" ", badge(`stale: ${e.parent} is now at @${e.latest_seq}`, "stale"));
    return li;
  }
  function edgeList(title, edges, here, outside) {
    body.appendChild(h("h3", null, `${title} (${edges.length + outside.length})`));
    if (!edges.length && !outside.length) { body.appendChild(h("div", "muted", "none")); return; }
    const ul = h("ul");
    ul.setAttribute("data-list", title.toLowerCase());
    for (const e of edges) ul.appendChild(edgeItem(e, here === "parent" ? e.child : e.parent, here));
    for (const e of outside) {
      const li = edgeItem(e, here === "parent" ? e.child : e.parent, here);
      li.append(" ", h("span", "muted", "(not in this selection)"));
      ul.appendChild(li);
    }
    body.appendChild(ul);
  }

  function showPanel(n) {
    body.replaceChildren();
    body.appendChild(h("h2", null, n.name));
    if (data.model_pages) {  // served: the model's own page (versions, card, files, tests)
      const open = h("a", null, "open its page");
      open.id = "model-page";
      open.href = data.model_pages + n.name.split("/").map(encodeURIComponent).join("/");
      body.appendChild(h("p")).appendChild(open);
    }
    const flags = h("div");
    if (n.removed) flags.appendChild(badge("removed: kept because a model was derived from it", "removed"));
    if (n.lossy) flags.appendChild(badge(`lossy: |error| <= ${n.lossy.eps}`, "lossy"));
    if (flags.childNodes.length) body.appendChild(flags);
    const facts = h("table");
    row(facts, [["latest"], [`@${n.seq} ${short(n.head)}`, "mono"]]);
    const tags = Object.entries(n.tags || {}).map(([k, v]) => `${k}=${v}`).join(" ");
    if (tags) row(facts, [["tags"], [tags, "mono"]]);
    row(facts, [["parameters"], [n.params.toLocaleString("en-US")]]);
    row(facts, [["size"], [`${size(n.logical_bytes)} (latest version, as files)`]]);
    const count = n.versions.length === 1 ? "its version" : `its ${n.versions.length} versions`;
    row(facts, [["stored"], [`${size(n.stored_bytes)} added to the store by ${count}`]]);
    row(facts, [["tensors"], [storageText(n.tensors)]]);
    body.appendChild(facts);

    const out = (data.outside || []);
    edgeList("Parents", parentsOf.get(n.name) || [], "child", out.filter((e) => e.child === n.name));
    edgeList("Children", childrenOf.get(n.name) || [], "parent", out.filter((e) => e.parent === n.name));

    body.appendChild(h("h3", null, `Versions (${n.versions.length})`));
    const table = h("table");
    table.id = "versions";
    row(table, [["seq"], ["id"], ["time (UTC)"], ["size", "num"], ["new", "num"], ["stored", "num"]], true);
    for (const v of n.versions) {
      const tr = row(table, [[`@${v.seq}`, "mono"], [short(v.id), "mono"], [when(v.time), "nowrap"],
                             [size(v.logical_bytes), "num"], [size(v.new_bytes), "num"], [size(v.stored_bytes), "num"]]);
      tr.setAttribute("data-version", v.id);
      tr.title = `tensors: ${storageText(v.tensors)}` + (v.lossy ? `; lossy, max error ${v.lossy.max_error}` : "");
      const tags = Object.entries(v.tags || {}).map(([k, val]) => `${k}=${val}`).join(" ");
      if (v.message || tags || v.lossy) {
        const more = h("tr", "more");
        const td = h("td", null, [v.message, tags && `[${tags}]`, v.lossy && "lossy"].filter(Boolean).join("  "));
        td.colSpan = 6;
        more.appendChild(td);
        table.appendChild(more);
      }
    }
    body.appendChild(table);
    body.appendChild(h("p", "muted", "size: as files; new: what the version added to the store; stored: every " +
                                     "object it uses, shared ones included. Hover a version for how its tensors are stored."));
    panel.hidden = false;
  }
  document.getElementById("close").addEventListener("click", () => select(null));

  draw();
  fit(true);
  if (data.selected && byName.has(data.selected)) select(data.selected);  // mgit serve: centred on a model
  window.mgitGraph = { view, select, fit };
})();
