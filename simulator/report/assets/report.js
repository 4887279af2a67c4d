// servesim report: unpacks the embedded plotly.js, draws every figure with the light or dark
// template the reader's system asks for, and makes tables sortable. No network access.
(function () {
  "use strict";

  function json(id) {
    return JSON.parse(document.getElementById(id).textContent);
  }

  // plotly.js is embedded gzip-compressed (base64): a third of its size.
  async function loadPlotly() {
    if (window.Plotly) return;
    const packed = document.getElementById("plotly-js-gz");
    const binary = atob(packed.textContent.trim());
    const bytes = new Uint8Array(binary.length);
    for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    const source = await new Response(stream).text();
    const script = document.createElement("script");
    script.textContent = source;
    document.head.appendChild(script);
  }

  const figures = json("servesim-figures");
  const templates = json("servesim-templates");
  const dark = window.matchMedia("(prefers-color-scheme: dark)");
  const config = { responsive: true, displaylogo: false, modeBarButtonsToRemove: ["select2d", "lasso2d"] };

  function draw(div) {
    const fig = figures[div.id];
    const layout = Object.assign({}, fig.layout, { template: templates[dark.matches ? "dark" : "light"] });
    return Plotly.react(div, fig.data, layout, config);
  }

  function drawAll() {
    return Promise.all(Array.from(document.querySelectorAll("div.plot")).map(draw));
  }

  const status = document.getElementById("loading");
  loadPlotly()
    .then(drawAll)
    .then(function () {
      document.body.dataset.rendered = "true";
      if (status) status.remove();
      dark.addEventListener("change", drawAll);
    })
    .catch(function (err) {
      document.body.dataset.rendered = "failed";
      if (status) {
        status.className = "plot-error";
        status.textContent = "The charts could not be drawn in this browser (" + err +
          "); the tables and the embedded data (#servesim-data) are complete.";
      }
    });

  // Sortable tables: a button in each header cell; numbers sort by their data-sort value.
  function sortTable(table, column, th) {
    const body = table.tBodies[0];
    const ascending = th.getAttribute("aria-sort") !== "ascending";
    table.querySelectorAll("th").forEach(function (h) { h.removeAttribute("aria-sort"); });
    th.setAttribute("aria-sort", ascending ? "ascending" : "descending");
    const rows = Array.from(body.rows);
    const key = function (row) {
      const cell = row.cells[column];
      const raw = cell.dataset.sort;
      if (raw !== undefined && raw !== "") return Number(raw);
      return cell.textContent.trim().toLowerCase();
    };
    rows.sort(function (a, b) {
      const x = key(a), y = key(b);
      const order = typeof x === "number" && typeof y === "number" ? x - y : String(x).localeCompare(String(y), undefined, { numeric: true });
      return ascending ? order : -order;
    });
    rows.forEach(function (row) { body.appendChild(row); });
  }

  document.querySelectorAll("table.sortable").forEach(function (table) {
    table.querySelectorAll("thead th").forEach(function (th, column) {
      const button = th.querySelector("button");
      if (button) button.addEventListener("click", function () { sortTable(table, column, th); });
    });
  });
})();
