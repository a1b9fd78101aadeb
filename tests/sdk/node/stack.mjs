// Starts an upstream (scripted or llmock) and recall in front of it, through
// the shared launcher tests/sdk/launch.py, and gives the tests what the
// upstream received and recall's stored history.
//
// The launcher runs under $RECALL_SDK_PYTHON, else `python3`; for llmock that
// Python (or PATH) must have llmock installed.

import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { fileURLToPath } from 'node:url';
import path from 'node:path';

const here = path.dirname(fileURLToPath(import.meta.url));
const launcher = path.join(here, '..', 'launch.py');

export const UPSTREAMS = ['scripted', 'llmock'];
export const SYSTEM_MESSAGE = "You are recall's SDK test assistant.";

async function http(method, url, body) {
  const init = { method, headers: {} };
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers['content-type'] = 'application/json';
  }
  const resp = await fetch(url, init);
  const text = await resp.text();
  let parsed;
  try {
    parsed = JSON.parse(text);
  } catch {
    parsed = text;
  }
  return { status: resp.status, body: parsed };
}

export async function startStack(upstream) {
  const python = process.env.RECALL_SDK_PYTHON || 'python3';
  const child = spawn(python, [launcher, upstream], { stdio: ['pipe', 'pipe', 'pipe'] });
  let stderr = '';
  child.stderr.on('data', (d) => (stderr += d));
  const info = await new Promise((resolve, reject) => {
    let out = '';
    const onData = (d) => {
      out += d;
      const nl = out.indexOf('\n');
      if (nl >= 0) {
        child.stdout.off('data', onData);
        try {
          resolve(JSON.parse(out.slice(0, nl)));
        } catch (e) {
          reject(new Error(`launcher said ${out}: ${e}`));
        }
      }
    };
    child.stdout.on('data', onData);
    child.once('exit', (code) => reject(new Error(`launcher exited with ${code}:\n${stderr}`)));
    child.once('error', reject);
  });
  return new Stack(child, info);
}

class Stack {
  constructor(child, info) {
    this.child = child;
    this.upstream = info.upstream;
    this.recallUrl = info.recall_url;
    this.upstreamUrl = info.upstream_url;
    this.recallLog = info.recall_log;
  }

  async stop() {
    if (this.child.exitCode !== null) return;
    const exited = once(this.child, 'exit');
    this.child.stdin.end(); // the launcher tears down when its stdin closes
    const timer = setTimeout(() => this.child.kill('SIGTERM'), 10_000);
    await exited;
    clearTimeout(timer);
  }

  /** The bodies of the chat completions the upstream received, oldest first. */
  async received() {
    if (this.upstream === 'scripted') {
      const { body } = await http('GET', `${this.upstreamUrl}/_received`);
      return body.filter((e) => e.path.endsWith('/chat/completions')).map((e) => e.body);
    }
    const { body } = await http('GET', `${this.upstreamUrl}/_llmock/requests`);
    return body.requests.filter((r) => r.path.endsWith('/chat/completions')).map((r) => r.body);
  }

  /** The request headers the scripted upstream received, oldest first. */
  async receivedHeaders() {
    const { body } = await http('GET', `${this.upstreamUrl}/_received`);
    return body.map((e) => e.headers);
  }

  async reset() {
    if (this.upstream === 'scripted') await http('DELETE', `${this.upstreamUrl}/_received`);
    else await http('POST', `${this.upstreamUrl}/_llmock/reset`);
  }

  /** Queues llmock scenario behaviours, e.g. {type: 'fail', status: 400}. */
  async llmock(...behaviors) {
    const { status, body } = await http('POST', `${this.upstreamUrl}/_llmock/scenario`, { behaviors });
    if (status !== 201) throw new Error(`llmock scenario refused: ${JSON.stringify(body)}`);
  }

  async history(session) {
    return http('GET', `${this.recallUrl}/v1/sessions/${session}/history`);
  }

  /** Polls the history until pred(contents) holds; returns the contents. */
  async waitHistory(session, pred, { within = 10_000, what = 'a matching history' } = {}) {
    const deadline = Date.now() + within;
    for (;;) {
      const { status, body } = await this.history(session);
      if (status === 200 && pred(body.contents)) return body.contents;
      if (Date.now() > deadline) {
        throw new Error(`timed out after ${within} ms waiting for ${what} in ${session}: ${JSON.stringify(body)}`);
      }
      await new Promise((r) => setTimeout(r, 20));
    }
  }
}
