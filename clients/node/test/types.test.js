// index.d.ts against the pinned TypeScript (a devDependency): a sample that uses every public call
// passes `tsc --strict --noEmit`, and a wrong one is refused on exactly its marked lines.
"use strict";

const { test } = require("node:test");
const assert = require("node:assert/strict");
const { spawnSync } = require("node:child_process");
const fs = require("node:fs");
const path = require("node:path");

const root = path.join(__dirname, "..");
const tsc = path.join(root, "node_modules", "typescript", "bin", "tsc");

function check(project) {
  assert.ok(fs.existsSync(tsc), "no TypeScript: run 'bash clients/test.sh --install-only'");
  const run = spawnSync(process.execPath, [tsc, "--strict", "--noEmit", "-p", path.join(__dirname, "types", project)], {
    cwd: root,
    encoding: "utf8",
  });
  return { status: run.status, out: run.stdout + run.stderr };
}

test("the sample that uses every call type-checks under --strict", () => {
  const { status, out } = check("tsconfig.json");
  assert.equal(status, 0, out);
});

test("the wrong sample is refused, on each marked line and only there", () => {
  const { status, out } = check("tsconfig.wrong.json");
  assert.notEqual(status, 0, "tsc accepted wrong.ts");
  const lines = fs.readFileSync(path.join(__dirname, "types", "wrong.ts"), "utf8").split("\n");
  const marked = lines.flatMap((l, i) => (/\/\/ wrong:/.test(l) ? [i + 1] : []));
  const reported = new Set([...out.matchAll(/wrong\.ts\((\d+),\d+\): error/g)].map((m) => Number(m[1])));
  assert.ok(marked.length >= 8);
  assert.deepEqual([...reported].sort((a, b) => a - b), marked, out);
});
