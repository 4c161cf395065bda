"""The page's style and its one script of its own: tables sort by a click on a header and filter as one types.
Everything else that moves on the page is Plotly's."""

from __future__ import annotations

STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1d2430; margin: 0;
       background: #f6f7f9; }
main { max-width: 1180px; margin: 0 auto; padding: 18px 24px 60px; }
header { background: #1d2430; color: #fff; padding: 18px 24px; }
header h1 { margin: 0 0 4px; font-size: 21px; font-weight: 600; }
header p { margin: 0; color: #c9d1dc; }
section { background: #fff; border: 1px solid #dfe3e8; border-radius: 8px; padding: 14px 18px; margin: 16px 0; }
section h2 { font-size: 17px; margin: 0 0 8px; }
.lede { font-size: 15px; }
.facts { display: grid; grid-template-columns: repeat(auto-fill, minmax(210px, 1fr)); gap: 8px 16px; margin: 8px 0; }
.fact { border-left: 3px solid #1f77b4; padding: 2px 8px; }
.fact b { display: block; font-size: 18px; }
.fact span { color: #5b6573; font-size: 12px; }
.note { color: #5b6573; font-size: 13px; }
.warn { color: #a23b00; }
.table-tools { display: flex; gap: 12px; align-items: center; margin: 6px 0; }
.table-tools input { padding: 5px 8px; width: 280px; border: 1px solid #c4cad3; border-radius: 4px; }
.table-wrap { max-height: 560px; overflow: auto; border: 1px solid #e6e9ee; }
table.cc-table { border-collapse: collapse; width: 100%; font-size: 13px; }
.cc-table th { position: sticky; top: 0; background: #eef1f5; cursor: pointer; user-select: none; text-align: left;
               padding: 6px 8px; white-space: nowrap; border-bottom: 1px solid #d3d8df; }
.cc-table th[aria-sort="ascending"]::after { content: " \\25B2"; }
.cc-table th[aria-sort="descending"]::after { content: " \\25BC"; }
.cc-table th.num { text-align: right; }
.cc-table td { padding: 4px 8px; border-bottom: 1px solid #f0f2f5; vertical-align: top; }
.cc-table td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.cc-table tr.chosen td { background: #fff3c4; font-weight: 600; }
details { margin: 10px 0; }
details > summary { cursor: pointer; color: #1f5f99; font-weight: 600; padding: 4px 0; }
footer { color: #7b8593; font-size: 12px; margin-top: 24px; }
"""

# Sorting reads a cell's data-v (the number behind a formatted cell) where it has one, else its text; a second
# click on the same header reverses the order. The filter keeps the rows whose text holds every word typed.
SCRIPT = """
(function () {
  function key(cell) {
    var v = cell.getAttribute('data-v');
    if (v !== null && v !== '') { return {n: parseFloat(v)}; }
    return {s: cell.textContent.trim().toLowerCase()};
  }
  function compare(a, b) {
    if (a.n !== undefined && b.n !== undefined) { return a.n - b.n; }
    if (a.n !== undefined) { return -1; }
    if (b.n !== undefined) { return 1; }
    return a.s < b.s ? -1 : (a.s > b.s ? 1 : 0);
  }
  function sortBy(table, index, th) {
    var body = table.tBodies[0];
    var ascending = th.getAttribute('aria-sort') !== 'ascending';
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (r1, r2) {
      var c = compare(key(r1.cells[index]), key(r2.cells[index]));
      return ascending ? c : -c;
    });
    rows.forEach(function (row) { body.appendChild(row); });
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (h) { h.removeAttribute('aria-sort'); });
    th.setAttribute('aria-sort', ascending ? 'ascending' : 'descending');
  }
  function filter(table, text, counter) {
    var words = text.toLowerCase().split(/\\s+/).filter(Boolean);
    var shown = 0, rows = table.tBodies[0].rows;
    Array.prototype.forEach.call(rows, function (row) {
      var t = row.textContent.toLowerCase();
      var keep = words.every(function (w) { return t.indexOf(w) >= 0; });
      row.style.display = keep ? '' : 'none';
      shown += keep ? 1 : 0;
    });
    if (counter) { counter.textContent = shown + ' of ' + rows.length + ' rows'; }
  }
  document.querySelectorAll('table.cc-table').forEach(function (table) {
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th, index) {
      th.addEventListener('click', function () { sortBy(table, index, th); });
    });
  });
  document.querySelectorAll('input.cc-filter').forEach(function (input) {
    var table = document.getElementById(input.getAttribute('data-table'));
    var counter = document.getElementById(input.getAttribute('data-table') + '-count');
    input.addEventListener('input', function () { filter(table, input.value, counter); });
  });
})();
"""
