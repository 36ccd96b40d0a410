// Draws Plotly figures one per task, charts in the viewport first, so a page paints and answers at once and a big
// run's charts come in while the reader looks at the first. Shared by the report (inlined) and the web view (served).
// <body data-plots-rendered="N"> marks the end (tests wait on it); data-first-plot-ms is when the first chart was up.
window.nnforgePlots = function (items, onClick) {
  var config = {responsive: true, displaylogo: false};
  var pending = items.slice();
  var total = pending.length;
  function visible(el) {
    var r = el.getBoundingClientRect();
    return r.bottom > 0 && r.top < (window.innerHeight || 800);
  }
  function take() {
    for (var i = 0; i < pending.length; i++) { if (visible(pending[i].el)) { return pending.splice(i, 1)[0]; } }
    return pending.shift();
  }
  function step() {
    var item = take();
    if (!item) { document.body.dataset.plotsRendered = String(total); return; }
    var el = item.el;
    var next = function () { setTimeout(step, 0); };
    try {
      Plotly.newPlot(el, item.fig.data, item.fig.layout, config).then(function () {
        el.dataset.rendered = "1";
        if (!document.body.dataset.firstPlotMs) { document.body.dataset.firstPlotMs = String(Math.round(performance.now())); }
        if (onClick) { el.on("plotly_click", onClick); }
        next();
      }, function (err) { console.error("plot " + el.id + " failed: " + err); next(); });
    } catch (err) { console.error("plot " + el.id + " failed: " + err); next(); }
  }
  if (typeof Plotly === "undefined") {
    console.error("plotly.js did not load"); document.body.dataset.plotsRendered = "0"; return;
  }
  step();
};
