"""One self-contained HTML page of a castcore result (``--html FILE``, ``castcore report``): the figures in words
and tables, and interactive charts drawn by Plotly, whose JavaScript is inlined so the page opens offline.

- charts: Plotly (the optional extra castcore[html]) and a figure as a page's part;
- document: the page around the sections, its tables and facts; assets: its style and the table's script;
- estimate, serve, simulate, sweep, plan: the sections of each command's page;
  layers, capture_charts: estimate's per-layer breakdown, roofline and memory over the capture;
  simulate_charts: simulate's distributions, traffic over time and batches;
  pareto_front: the front of sweep's and plan's candidates;
- results: a saved results file read back and checked; write: the page of a result, written whole.
"""
