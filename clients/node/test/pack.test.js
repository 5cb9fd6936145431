// Packaging as a user gets it: `npm pack` from the tree leaves nothing behind and ships every file the
// code loads; a fresh app installs the tarball and runs this README's blocks as they are written.
"use strict";

const { test, before, after } = require("node:test");
const assert = require("node:assert/strict");
const { execFile } = require("node:child_process");
const { promisify } = require("node:util");
const fs = require("node:fs");
const os = require("node:os");
const path = require("node:path");
const { startRedis } = require("./support/redis");

const run = promisify(execFile);
const root = path.join(__dirname, "..");
const npm = process.platform === "win32" ? "npm.cmd" : "npm";

let server, work, tarball, shipped;

/** Every file under `dir` (but node_modules) with its size and mtime: what a build could leave behind. */
function snapshot(dir, base = dir, out = []) {
  for (const e of fs.readdirSync(dir, { withFileTypes: true })) {
    if (e.name === "node_modules") continue;
    const p = path.join(dir, e.name);
    if (e.isDirectory()) snapshot(p, base, out);
    else out.push(`${path.relative(base, p)} ${fs.statSync(p).size} ${fs.statSync(p).mtimeMs}`);
  }
  return out.sort();
}

before(async () => {
  server = await startRedis();
  work = fs.mkdtempSync(path.join(os.tmpdir(), "hourglass-pack-"));
  const tree = snapshot(root);
  const { stdout } = await run(npm, ["pack", "--pack-destination", work, "--json", "--loglevel=error"], { cwd: root });
  assert.deepEqual(snapshot(root), tree, "npm pack changed the source tree");
  const [packed] = JSON.parse(stdout);
  tarball = path.join(work, packed.filename);
  shipped = packed.files.map((f) => f.path);
});

after(async () => {
  await server.stop();
  fs.rmSync(work, { recursive: true, force: true });
});

test("the tarball ships every file the code loads, and no tests or benches", () => {
  assert.ok(fs.existsSync(tarball));
  for (const f of ["package.json", "README.md", "index.js", "index.d.ts"]) assert.ok(shipped.includes(f), f);
  for (const js of shipped.filter((f) => f.endsWith(".js"))) {
    const source = fs.readFileSync(path.join(root, js), "utf8");
    for (const [, dep] of source.matchAll(/require\("\.\/([^"]+)"\)/g)) {
      const file = path.extname(dep) ? dep : `${dep}.js`;
      assert.ok(shipped.includes(file), `${js} loads ./${dep}, which is not in the tarball`);
    }
    for (const [, name] of source.matchAll(/load\("([a-z_]+)"\)/g)) assert.ok(shipped.includes(`scripts/${name}.lua`), name);
  }
  for (const s of fs.readdirSync(path.join(root, "scripts"))) assert.ok(shipped.includes(`scripts/${s}`), s);
  assert.deepEqual(shipped.filter((f) => f.startsWith("test/") || f.includes("bench")), []);
});

test("a fresh app installs the tarball and runs the README's blocks as written; they type-check", async () => {
  const app = path.join(work, "app");
  fs.mkdirSync(app);
  fs.writeFileSync(path.join(app, "package.json"), JSON.stringify({ name: "app", version: "1.0.0", private: true }));
  const ioredis = require("../package.json").devDependencies.ioredis;
  await run(npm, ["install", tarball, `ioredis@${ioredis}`, "--prefer-offline", "--no-audit", "--no-fund", "--loglevel=error"], {
    cwd: app,
    timeout: 240000,
  });
  const readme = fs.readFileSync(path.join(root, "README.md"), "utf8");
  const blocks = [...readme.matchAll(/```js\n([\s\S]*?)```/g)].map((m) => m[1]);
  assert.equal(blocks.length, 2, "the quick start and the wait block");
  // The one change: the README's localhost:6379 becomes this test's private server.
  const local = (code) => {
    assert.equal(code.split("new Redis()").length, 2, "one `new Redis()` in each block");
    return code.replace("new Redis()", "new Redis({ path: process.env.HG_TEST_SOCKET })");
  };
  fs.writeFileSync(path.join(app, "quick.js"), local(blocks[0]));
  fs.writeFileSync(path.join(app, "wait.js"), local(blocks[1]));
  const env = { ...process.env, HG_TEST_SOCKET: server.socket };

  const quick = await run(process.execPath, ["quick.js"], { cwd: app, env, timeout: 60000 });
  const said = ["scheduled 5000", 'due {"order":42}', "{ state: 'scheduled', holder: '', groupTold: false }", "waiting 5000"];
  said.push("{ state: 'sealed', fired: null }", 'HG_GROUP_CLOSED group "o-17" is sealed');
  said.push("[ 'reserve scheduled', 'charge scheduled', 'ship waiting' ]");
  for (const line of said) {
    assert.ok(quick.stdout.includes(line), `${line} not in:\n${quick.stdout}`);
  }
  assert.equal(await server.redis.zcard("hourglass:{mail.reminder}:due"), 5000);

  // The wait block, with a stand-in host that ends each task it finds due or waiting.
  const redis = server.redis;
  await redis.xadd("hourglass:{order.timeout}:events", "*", "x", "y");
  await redis.xtrim("hourglass:{order.timeout}:events", "MAXLEN", 0);
  const host = setInterval(async () => {
    for (const id of await redis.zrange("hourglass:{order.timeout}:due", 0, -1)) {
      if ((await redis.zrem("hourglass:{order.timeout}:due", id)) === 1) {
        await redis.xadd("hourglass:{order.timeout}:events", "*", "id", id, "outcome", "succeeded", "attempt", 1, "finished_ms", Date.now());
      }
    }
  }, 50);
  try {
    const waited = await run(process.execPath, ["wait.js"], { cwd: app, env, timeout: 60000 });
    assert.equal(waited.stdout.trim(), "succeeded 1 null");
  } finally {
    clearInterval(host);
  }

  // Both blocks against the installed package's typings (checkJs, strict).
  const tsc = path.join(root, "node_modules", "typescript", "bin", "tsc");
  const args = ["--strict", "--noEmit", "--allowJs", "--checkJs", "--target", "es2020", "--module", "commonjs", "--moduleResolution", "node"];
  args.push("--types", "node", "--typeRoots", path.join(root, "node_modules", "@types"), "quick.js", "wait.js");
  const checked = await run(process.execPath, [tsc, ...args], { cwd: app }).catch((e) => e);
  assert.equal(checked.code ?? 0, 0, `${checked.stdout}${checked.stderr}`);
});
