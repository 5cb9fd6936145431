// js.compute: a JavaScript handler that computes, for choosing an engine (BENCHMARKS.md, "JavaScript
// engines"): neither engine can compile to machine code inside WebAssembly, so both interpret, and what a
// task's own work costs is the interpreter's (QuickJS-ng's or SpiderMonkey's) and its JSON's.
//
// - payload `json`: JSON.parse, then JSON.stringify, of a 100 KB document built at build time;
// - payload `loop`: a loop of 10^6 steps of integer arithmetic;
// - anything else: nothing (a no-op, as js.noop).
//
// Build: `bash plugins/build-polyglot.sh` (js.compute.wasm on QuickJS, js-sm.compute.wasm on StarlingMonkey).

// About 100 KB of orders, as text: built once, at build time (the module is evaluated in the snapshot).
const orders = [];
for (let i = 0; i < 1000; i++) {
  orders.push({ id: `order-${i}`, customer: { name: `Customer ${i}`, tier: i % 3 }, total: i * 1.25, lines: [i, i + 1, i + 2] });
}
const document = JSON.stringify({ orders });

export function handle(task) {
  const what = String.fromCharCode(...task.payload);
  if (what === "json") {
    const parsed = JSON.parse(document);
    if (JSON.stringify(parsed).length !== document.length) throw { tag: "error", val: "round trip changed" };
  } else if (what === "loop") {
    let x = 0;
    for (let i = 0; i < 1000000; i++) x = (x + i * 7) % 1000003;
    if (x < 0) throw { tag: "error", val: "impossible" };
  }
}
