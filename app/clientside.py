"""The page's script: what a new budget, reserve, price, epoch size or selected plan redraws in the
browser, with no request to the server (issue 40: a redraw within 200 ms, nothing recomputed).

:data:`VIEW_JS` is a Dash clientside callback.  It takes the frontier figure the server drew once
per result (:func:`~.figures.frontier_figure` without a budget; every trace's ``meta`` says what
it is), the page data (:func:`~.views.page_data`: every drawn plan's per-device peaks, each
device's memory and price key, the batch) and the controls, and returns:

- the figure with each plan grey where it does not fit (the rule of
  :func:`tensoropt.planmodel.fits.fits`: every device's peak ≤ min(its memory, budget) − reserve),
  its hover saying which device is over and by how much (:func:`~.figures.over_text`'s words) and
  naming the other plans at its point (:func:`~.figures.coinciding`),
  the budget line at budget − reserve, and the rings of the fastest plan that fits, the selected
  plan and the compared one moved (:func:`~.figures.frontier_figure`'s ``selected`` / ``compare``);
- the GPUs-needed table (:func:`~.prices.gpus_needed`: per device count — every one from 1 to the
  devices chosen — the fastest plan that fits, samples/s, scaling efficiency, GPU-hours and dollars
  per 1,000 steps and per epoch; a count dominated by a smaller one — no faster, no cheaper,
  :func:`~.prices.dominated` — folded into "use the 4-GPU plan");
- the line saying how many plans fit;
- the decision line at the top of the page (:func:`~.views.decision_text` of
  :func:`~.prices.decide`: the cheapest and the fastest plan that fits).

The Python functions named above are the reference: the browser tests hold this script to them
on the same data.  It is a Python string so that it ships inside the package (the dashboard's
package data is its modules only).

It owns the browser's arithmetic of the budget and the prices; it must not compute anything the
server has not handed it (no plan is simulated here).
"""

from __future__ import annotations

#: the functions, defined once per page (``window.tensoropt``)
_LIB = r"""
window.tensoropt = (function () {
  const GiB = 1073741824, GREY = "#b8b8b8";
  function fmtBytes(n) {
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    for (let i = 0; i < units.length; i++) {
      if (Math.abs(n) < 1024 || units[i] === "TiB") {
        return units[i] === "B" ? (Math.round(n) + " B") : (n.toFixed(1) + " " + units[i]);
      }
      n /= 1024;
    }
  }
  function gibBytes(v) {       // views.gib_bytes
    if (v === null || v === undefined || v === "") return null;
    const g = Number(v);
    return (isFinite(g) && g > 0) ? g * GiB : null;
  }
  function overBy(peaks, capacity, budget, reserve) {   // tensoropt.planmodel.fits.over_by
    const out = {};
    for (const d of Object.keys(peaks)) {
      let cap = capacity[d];
      if (budget !== null) cap = Math.min(cap, budget);
      const x = peaks[d] - (cap - reserve);
      if (x > 0) out[d] = Math.ceil(x);
    }
    return out;
  }
  function overText(over) {    // figures.over_text
    const groups = new Map();
    for (const d of Object.keys(over)) {
      if (!groups.has(over[d])) groups.set(over[d], []);
      groups.get(over[d]).push(d);
    }
    const parts = [];
    for (const [x, ds] of groups) {
      parts.push(ds.join(", ") + " over by " + fmtBytes(x) + (ds.length > 1 ? " each" : ""));
    }
    return parts.join("; ");
  }
  function fitFlags(data, budget, reserve) {
    const fit = {}, over = {};
    for (const p of data.plans) {
      const o = overBy(p.peaks, data.capacity, budget, reserve);
      over[p.plan_id] = overText(o);
      fit[p.plan_id] = Object.keys(o).length === 0;
    }
    return [fit, over];
  }
  function priceOf(prices, key) {
    if (key in prices && prices[key] !== null) return prices[key];
    return ("*" in prices && prices["*"] !== null) ? prices["*"] : null;
  }
  function costs(p, data, prices, epoch) {   // prices.plan_costs
    const hours = p.time_s / 3600, k = p.devices.length, batch = data.batch;
    const steps = (epoch > 0 && batch > 0) ? Math.ceil(epoch / batch) : null;
    let usd = 0;
    for (const d of p.devices) {
      const v = priceOf(prices, data.price_keys[d]);
      usd = (v === null || usd === null) ? null : usd + v;
    }
    return {samples_per_s: (batch && p.time_s > 0) ? batch / p.time_s : null,
            hours_per_1k_steps: hours * 1000, hours_per_epoch: steps ? hours * steps : null,
            gpu_hours_per_1k_steps: k * hours * 1000,
            gpu_hours_per_epoch: steps ? k * hours * steps : null,
            usd_per_1k_steps: usd === null ? null : usd * hours * 1000,
            usd_per_epoch: (usd === null || !steps) ? null : usd * hours * steps};
  }
  function gpusNeeded(data, fit, prices, epoch, room) {   // prices.gpus_needed
    const byK = new Map();
    for (const k of (data.counts || [])) byK.set(k, []);
    for (const p of data.plans) {
      const k = p.devices.length;
      if (!byK.has(k)) byK.set(k, []);
      byK.get(k).push(p);
    }
    const rows = [];
    let base = null;
    for (const k of Array.from(byK.keys()).sort((a, b) => a - b)) {
      const all = byK.get(k), ok = all.filter(p => fit[p.plan_id]);
      if (!all.length) {
        const bound = (data.least || {})[k];
        if (bound !== undefined && room !== undefined && room !== null && bound > room)
          rows.push({k: k, plan_id: null, least_memory_bytes: bound, at_least: true});
        else rows.push({k: k, plan_id: null, least_memory_bytes: null});
        continue;
      }
      if (!ok.length) {
        rows.push({k: k, plan_id: null, least_memory_bytes: Math.min(...all.map(p => p.memory_bytes))});
        continue;
      }
      ok.sort((a, b) => (us(a.time_s) - us(b.time_s)) || (a.memory_bytes - b.memory_bytes));
      const best = ok[0];
      const row = Object.assign({k: k, plan_id: best.plan_id, label: best.label, time_s: best.time_s,
                                 memory_bytes: best.memory_bytes}, costs(best, data, prices, epoch));
      if (base === null) base = [k, best.time_s];
      row.efficiency = (base[1] / best.time_s) / (k / base[0]);
      row.efficiency_vs = base[0];
      const over = rows.filter(r => r.plan_id !== null && dominated(row, r));
      if (over.length) {
        const use = first(over, faster);
        row.use_k = use.k;
        row.use_plan_id = use.plan_id;
      }
      rows.push(row);
    }
    return rows;
  }
  // The decision: prices.py's _us, COST_TIE, cost_column, _cost_order, dominated, _faster, _cheaper, _first
  // and decide, line for line (the rule is written there; tests/dashboard/test_decision.py holds the two
  // to the same answers), and views.decision_text's words.
  const COST_TIE = 1e-9;
  function us(t) { return Math.floor(t * 1e6 + 0.5); }
  function costColumn(rows) {
    return rows.every(r => r.usd_per_1k_steps !== null) ? "usd_per_1k_steps" : "gpu_hours_per_1k_steps";
  }
  function costOrder(a, b, column) {
    const x = a[column], y = b[column];
    if (Math.abs(x - y) <= COST_TIE * Math.max(Math.abs(x), Math.abs(y))) return 0;
    return x < y ? -1 : 1;
  }
  function dominated(row, by) {
    return by.k < row.k && us(by.time_s) <= us(row.time_s) && costOrder(by, row, costColumn([by, row])) <= 0;
  }
  function faster(a, b, column) {
    if (us(a.time_s) !== us(b.time_s)) return us(a.time_s) < us(b.time_s);
    if (a.k !== b.k) return a.k < b.k;
    return costOrder(a, b, column) < 0;
  }
  function cheaper(a, b, column) {
    const order = costOrder(a, b, column);
    if (order) return order < 0;
    if (a.k !== b.k) return a.k < b.k;
    return us(a.time_s) < us(b.time_s);
  }
  function first(rows, before) {
    const column = costColumn(rows);
    let best = rows[0];
    for (const r of rows.slice(1)) if (before(r, best, column)) best = r;
    return best;
  }
  function decide(rows) {
    const ok = rows.filter(r => r.plan_id !== null && r.plan_id !== undefined);
    if (!ok.length) return {cheapest: null, fastest: null, cost: null};
    return {cheapest: first(ok, cheaper), fastest: first(ok, faster), cost: costColumn(ok)};
  }
  function hoursText(h) {   // views._hours
    return h.toFixed(h > 0 ? Math.min(9, Math.max(0, 2 - Math.floor(Math.log10(h)))) : 0);
  }
  function decided(row, cost) {   // views._decided
    const epoch = row.hours_per_epoch !== null, per = epoch ? "epoch" : "1k_steps", unit = epoch ? "epoch" : "1k steps";
    const money = cost === "usd_per_1k_steps" ? "$" + row["usd_per_" + per].toFixed(epoch ? 2 : 4)
                                              : row["gpu_hours_per_" + per].toFixed(epoch ? 3 : 4) + " GPU-h";
    return row.k + " GPU" + (row.k !== 1 ? "s" : "") + ", " + (row.time_s * 1e3).toFixed(3) + " ms a step, " +
           money + " per " + unit + ", " + hoursText(row["hours_per_" + per]) + " h per " + unit;
  }
  function decisionText(rows) {   // views.decision_text
    const d = decide(rows);
    if (d.cheapest === null || d.fastest === null)
      return "no plan fits on any number of GPUs: raise the budget, lower the reserve or choose more devices";
    const tail = d.cost === "usd_per_1k_steps" ? "" : " (GPU-hours: set a price per GPU-hour for dollars)";
    if (d.cheapest === d.fastest) return "cheapest and fastest that fits: " + decided(d.fastest, d.cost) + tail;
    return "cheapest that fits: " + decided(d.cheapest, d.cost) + "; fastest that fits: " +
           decided(d.fastest, d.cost) + tail;
  }
  function num(v, digits) { return (v === null || v === undefined) ? "" : v.toFixed(digits); }
  function tableRows(rows) {
    const FOLDED = {step_ms: "", samples_s: "", efficiency: "", memory: "", gpuh_1k: "", usd_1k: "", gpuh_epoch: "",
                    usd_epoch: ""};
    return rows.map(r => r.use_k !== undefined ? Object.assign({
      // dominated by a smaller count (no faster, no cheaper): its plan not listed; a click opens the smaller count's
      gpus: r.k, plan_id: r.use_plan_id,
      plan: "use the " + r.use_k + "-GPU plan: no slower, no dearer"}, FOLDED)
    : r.plan_id === null ? {
      gpus: r.k, plan: r.least_memory_bytes === null ? "no plan" : "none fits", step_ms: "", samples_s: "",
      efficiency: "", memory: r.least_memory_bytes === null ? "" :
                              (r.at_least ? "at least " : "least ") + fmtBytes(r.least_memory_bytes),
      gpuh_1k: "", usd_1k: "", gpuh_epoch: "", usd_epoch: ""
    } : {
      gpus: r.k, plan_id: r.plan_id, plan: r.label === r.plan_id ? r.plan_id : r.label + " (" + r.plan_id + ")",
      step_ms: num(r.time_s * 1e3, 3),
      samples_s: r.samples_per_s === null ? "" : Math.round(r.samples_per_s).toLocaleString("en-US"),
      efficiency: (r.efficiency * 100).toFixed(0) + " % (vs " + r.efficiency_vs + ")",
      memory: fmtBytes(r.memory_bytes), gpuh_1k: num(r.gpu_hours_per_1k_steps, 4),
      usd_1k: r.usd_per_1k_steps === null ? "set a price" : "$" + num(r.usd_per_1k_steps, 4),
      gpuh_epoch: num(r.gpu_hours_per_epoch, 3),
      usd_epoch: r.usd_per_epoch === null ? (r.gpu_hours_per_epoch === null ? "" : "set a price")
                                          : "$" + num(r.usd_per_epoch, 2)});
  }
  function limitText(budget, reserve) {   // figures.limit_text
    const t = budget === null ? "each device's memory" : "a budget of " + fmtBytes(budget) + " per device";
    return t + (reserve ? ", less a reserve of " + fmtBytes(reserve) : "");
  }
  function restyle(base, data, fit, over, budget, reserve, selected, compare) {
    const fig = JSON.parse(JSON.stringify(base));
    const scale = fig.layout.meta.scale;
    const byId = {};
    for (const p of data.plans) byId[p.plan_id] = p;
    // figures.fastest_that_fits: the step to the microsecond, ties to fewer GPUs, then less memory
    let best = null;
    for (const p of data.plans) {
      if (fit[p.plan_id] && (best === null || us(p.time_s) < us(best.time_s) ||
                             (us(p.time_s) === us(best.time_s) && (p.devices.length < best.devices.length ||
                              (p.devices.length === best.devices.length && p.memory_bytes < best.memory_bytes)))))
        best = p;
    }
    for (const t of fig.data) {
      const role = t.meta && t.meta.role;
      if (role === "curve" || role === "baseline") {
        const ids = t.customdata;
        t.marker.color = ids.map(id => fit[id] ? t.meta.colour : GREY);
        // figures.hover_text: the plan, why it does not fit, then every other plan at its point (figures.coinciding)
        const tail = id => over[id] ? "<br><i>does not fit: " + over[id] + "</i>" : "";
        t.hovertemplate = ids.map((id, i) => t.meta.heads[i] + tail(id) +
          ((t.meta.others || [])[i] || []).map(([o, line]) => "<br>" + line + tail(o)).join("") + "<extra></extra>");
      } else if (role === "best-fit" || role === "selected" || role === "compare") {
        // figures._mark's ring, here: the fastest that fits moves with the budget, the selected and compared
        // plans with a click (the server's figure stays the same: 126 KB not sent again on each click)
        const p = role === "best-fit" ? best : (byId[role === "selected" ? selected : compare] || null);
        t.x = p ? [p.memory_bytes / scale] : [];
        const edge = fig.layout.meta.y_edge;   // figures._drawn_y: an off-scale plan sits at the top edge
        t.y = p ? [edge === null || edge === undefined ? p.time_s * 1e3 : Math.min(p.time_s * 1e3, edge)] : [];
        t.customdata = p ? [p.plan_id] : [];
      }
    }
    fig.layout.shapes = [];
    fig.layout.annotations = (fig.layout.annotations || []).filter(a => !(a.name === "budget"));
    if (budget !== null) {
      const at = budget - reserve;
      const label = "budget " + fmtBytes(budget) + (reserve ? " − reserve " + fmtBytes(reserve) : "");
      const top = Math.max(0, ...data.plans.map(p => p.memory_bytes));
      if (at <= 1.5 * top || !data.plans.length) {
        fig.layout.shapes.push({type: "line", name: "budget", xref: "x", yref: "paper", x0: at / scale,
                                x1: at / scale, y0: 0, y1: 1, line: {color: "red", dash: "dash"}});
        fig.layout.annotations.push({name: "budget", xref: "x", yref: "paper", x: at / scale, y: 1,
                                     xanchor: "right", yanchor: "bottom", showarrow: false, text: label,
                                     font: {color: "red"}});
      } else {
        fig.layout.annotations.push({name: "budget", xref: "paper", yref: "paper", x: 1, y: 1.02,
                                     showarrow: false, xanchor: "right", text: label + ": line off scale →",
                                     font: {color: "red"}});
      }
    }
    return [fig, best];
  }
  function view(base, data, budgetGiB, reserveGiB, priceValues, priceIds, epoch, selected, compare) {
    const t0 = performance.now();
    if (!base || !data) return [base || {}, [], "", ""];
    const budget = gibBytes(budgetGiB);
    const reserve = Math.floor(gibBytes(reserveGiB) || 0);
    const [fit, over] = fitFlags(data, budget, reserve);
    const prices = {};
    (priceIds || []).forEach((id, i) => {
      const v = Number(priceValues[i]);
      prices[id.kind] = (priceValues[i] === null || priceValues[i] === "" || !isFinite(v) || v < 0) ? null : v;
    });
    const [fig, best] = restyle(base, data, fit, over, budget, reserve, selected, compare);
    const epochN = Number(epoch);
    // the most any device may hold under the budget: a count whose every plan needs more fits nowhere
    const room = Math.max(...Object.values(data.capacity).map(c => (budget === null ? c : Math.min(c, budget))
                                                                   - reserve));
    const rows = gpusNeeded(data, fit, prices, isFinite(epochN) && epochN > 0 ? epochN : null, room);
    const curvePlans = data.plans.filter(p => p.role === "curve");
    const nFit = curvePlans.filter(p => fit[p.plan_id]).length;
    const line = nFit + " of " + curvePlans.length + " plans on the curves fit " + limitText(budget, reserve) +
      (best ? "; the fastest that fits: " + best.label + " on " + best.devices.length + " GPU" +
              (best.devices.length > 1 ? "s" : "") + ", " + (best.time_s * 1e3).toFixed(3) + " ms" : "");
    window.tensoropt.last = {ms: performance.now() - t0, budget: budget, reserve: reserve, fit: fit,
                             rows: rows, prices: prices};
    return [fig, tableRows(rows), line, decisionText(rows)];
  }
  return {view: view, fitFlags: fitFlags, gpusNeeded: gpusNeeded, fmtBytes: fmtBytes, overText: overText,
          dominated: dominated, decide: decide, decisionText: decisionText, tableRows: tableRows};
})();
"""

#: the clientside callback (Dash wraps it in its own call): defines the functions on first use
VIEW_JS = ("function(base, data, budget, reserve, priceValues, epoch, selected, compare, priceIds) {\n"
           "  if (!window.tensoropt) {" + _LIB + "}\n"
           "  return window.tensoropt.view(base, data, budget, reserve, priceValues, priceIds, epoch, selected,"
           " compare);\n}")

__all__ = ["VIEW_JS"]
