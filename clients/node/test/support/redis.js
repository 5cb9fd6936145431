// A private redis-server (or valkey-server: whatever `redis-server` is on PATH) on a unix socket in a
// temp dir, for one test file; never a TCP port.
"use strict";

const { spawn } = require("node:child_process");
const fs = require("node:fs");
const os = require("node:os");
const path = require("node:path");
const Redis = require("ioredis");

/** Starts it; resolves to { redis, socket, dir, stop }. */
async function startRedis() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "hourglass-node-"));
  const socket = path.join(dir, "redis.sock");
  const server = spawn("redis-server", ["--port", "0", "--unixsocket", socket, "--save", "", "--appendonly", "no", "--dir", dir], {
    stdio: "ignore",
  });
  const deadline = Date.now() + 20000;
  while (!fs.existsSync(socket)) {
    if (Date.now() > deadline) {
      server.kill();
      throw new Error("redis-server did not start");
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  const redis = new Redis({ path: socket, maxRetriesPerRequest: 1 });
  await redis.ping();
  const stop = async () => {
    redis.disconnect();
    if (server.exitCode === null) await new Promise((resolve) => (server.once("exit", resolve), server.kill()));
    fs.rmSync(dir, { recursive: true, force: true });
  };
  return { redis, socket, dir, stop };
}

module.exports = { startRedis };
