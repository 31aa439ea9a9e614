// Draws a dashboard page from its JSON (/api/...) with Plotly, and redraws it in place when the
// server says the run changed (server-sent events): no reload, no state lost.
(function () {
  "use strict";
  const root = document.getElementById("page");
  const api = root.dataset.api;
  const status = document.getElementById("status");
  const state = { renders: 0, charts: 0, errors: [], loading: false, again: false, version: null, announced: null };
  window.libraDashboard = state;

  function el(tag, attrs, text) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function formatCell(value) {
    if (value === null || value === undefined) return "";
    if (typeof value === "number") return Number.isInteger(value) ? value.toLocaleString("en-US") : String(value);
    return String(value);
  }

  function navigate(query) {
    history.pushState(null, "", query ? "?" + query : location.pathname);
    load();
  }

  function renderControls(controls) {
    const box = document.getElementById("controls");
    box.replaceChildren();
    for (const c of controls) {
      const label = el("label", {}, c.label + " ");
      if (c.multiple) {
        const chosen = new Set(c.value);
        const list = el("span", { class: "choices" });
        for (const [value, text] of c.options) {
          const item = el("label", { class: "choice" });
          const box_ = el("input", { type: "checkbox", value: value, name: c.name });
          box_.checked = chosen.has(value);
          box_.addEventListener("change", () => {
            const params = new URLSearchParams(location.search);
            params.delete(c.name);
            for (const b of list.querySelectorAll("input:checked")) params.append(c.name, b.value);
            navigate(params.toString());
          });
          item.append(box_, " " + text);
          list.append(item);
        }
        label.append(list);
      } else {
        const select = el("select", { name: c.name });
        for (const [value, text] of c.options) {
          const option = el("option", { value: value }, text);
          option.selected = value === c.value;
          select.append(option);
        }
        select.addEventListener("change", () => {
          const params = new URLSearchParams(location.search);
          params.set(c.name, select.value);
          navigate(params.toString());
        });
        label.append(select);
      }
      box.append(label);
    }
  }

  function renderSummary(summary) {
    const box = document.getElementById("summary");
    box.replaceChildren();
    for (const [label, value] of summary) {
      const card = el("div", { class: "card" });
      card.append(el("div", { class: "value" }, value), el("div", { class: "label" }, label));
      box.append(card);
    }
  }

  async function renderCharts(charts) {
    const box = document.getElementById("charts");
    const keep = new Set(charts.map((c) => "chart-" + c.key));
    for (const child of Array.from(box.children)) if (!keep.has(child.id)) child.remove();
    // every card in place first, then draw: Plotly sizes a plot to its card when it draws it
    const cards = charts.map((c, i) => {
      let card = document.getElementById("chart-" + c.key);
      if (!card) {
        card = el("section", { id: "chart-" + c.key, class: "chart" });
        card.append(el("h2"), el("div", { id: "plot-" + c.key, class: "plot" }), el("p", { class: "note" }));
      }
      if (box.children[i] !== card) box.insertBefore(card, box.children[i] || null);
      card.querySelector("h2").textContent = c.title;
      card.querySelector(".note").textContent = c.note || "";
      return card;
    });
    const drawing = [];
    charts.forEach((c, i) => {
      const plot = cards[i].querySelector(".plot");
      if (c.figure) {
        plot.classList.remove("empty");
        if (!plot.classList.contains("js-plotly-plot")) plot.replaceChildren();
        drawing.push(Plotly.react(plot, c.figure.data, c.figure.layout, { responsive: true, displaylogo: false }));
      } else {
        if (plot.classList.contains("js-plotly-plot")) {
          Plotly.purge(plot);
          plot.classList.remove("js-plotly-plot");
        }
        plot.replaceChildren();
        plot.classList.add("empty");
        plot.textContent = c.empty;
      }
    });
    await Promise.all(drawing);
    state.charts = drawing.length;
  }

  function renderTables(tables) {
    const box = document.getElementById("tables");
    box.replaceChildren();
    for (const t of tables) {
      const section = el("section", { class: "table", id: "table-" + t.key });
      section.append(el("h2", {}, t.title));
      if (t.rows.length) {
        const table = el("table", { class: "data" });
        const head = el("tr");
        for (const c of t.columns) head.append(el("th", {}, c));
        const thead = el("thead");
        thead.append(head);
        table.append(thead);
        const body = el("tbody");
        t.rows.forEach((row, i) => {
          const tr = el("tr");
          row.forEach((cell, j) => {
            const td = el("td", typeof cell === "number" ? { class: "num" } : {});
            const link = t.links && t.links[i];
            if (j === 1 && link) {
              const a = el("a", { href: "?" + link }, formatCell(cell));
              a.addEventListener("click", (event) => { event.preventDefault(); navigate(link); });
              td.append(a);
            } else td.textContent = formatCell(cell);
            tr.append(td);
          });
          body.append(tr);
        });
        table.append(body);
        section.append(table);
      }
      if (t.note) section.append(el("p", { class: "note" }, t.note));
      box.append(section);
    }
  }

  function renderReads(reads, builtMs) {
    const body = document.querySelector("#reads tbody");
    body.replaceChildren();
    for (const r of reads) {
      const tr = el("tr");
      tr.append(el("td", {}, r.name), el("td", { class: "num" }, r.ms + " ms"), el("td", { class: "num" }, r.rows.toLocaleString("en-US") + " rows"));
      body.append(tr);
    }
    const tr = el("tr");
    tr.append(el("td", {}, "page built in"), el("td", { class: "num" }, builtMs + " ms"), el("td"));
    body.append(tr);
  }

  function showNotice(text) {
    const notice = document.getElementById("notice");
    notice.hidden = !text;
    notice.textContent = text || "";
  }

  async function load() {
    if (state.loading) { state.again = true; return; }
    state.loading = true;
    try {
      const response = await fetch(api + location.search, { cache: "no-store" });
      const json = (response.headers.get("content-type") || "").startsWith("application/json");
      const body = json ? await response.json() : { error: "the dashboard answered " + response.status };
      if (!response.ok) {
        showNotice(body.error || "the page could not be built (" + response.status + ")");
        state.version = body.version || state.announced || state.version;
        for (const id of ["controls", "summary", "charts", "tables"]) document.getElementById(id).replaceChildren();
      } else {
        state.version = body.version;
        document.getElementById("title").textContent = body.title;
        document.title = body.title + " · Libra";
        renderControls(body.controls);
        renderSummary(body.summary);
        showNotice(body.notice);
        await renderCharts(body.charts);
        renderTables(body.tables);
        renderReads(body.reads, body.built_ms);
      }
      state.renders += 1;
      status.textContent = "updated " + new Date().toLocaleTimeString();
    } catch (error) {
      state.errors.push(String(error));
      status.textContent = "cannot reach the dashboard (" + error + ")";
    } finally {
      state.loading = false;
      const stale = state.announced !== null && state.version !== null && state.announced !== state.version;
      if (state.again || stale) { state.again = false; load(); }
    }
  }

  window.addEventListener("popstate", load);
  const source = new EventSource(root.dataset.events);
  // the runs' version now (on every connection) and on each change: reload when it is not the
  // version this page's data was read at
  source.addEventListener("version", (event) => {
    state.announced = JSON.parse(event.data);
    if (state.version !== null && state.announced !== state.version) load();
  });
  window.addEventListener("pagehide", () => source.close());
  source.addEventListener("open", () => { status.classList.add("live"); });
  source.addEventListener("error", () => { status.classList.remove("live"); });
  load();
})();
