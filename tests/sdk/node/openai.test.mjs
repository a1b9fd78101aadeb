// recall end to end through the official OpenAI Node SDK.
//
// Every test runs twice: against the scripted upstream
// (tests/sdk/scripted_upstream.py, which answers by what the last message
// says) and against llmock (a third-party mock that echoes the whole prompt,
// scripted through its /_llmock/scenario API). The client sends only the
// new message each turn: whatever else the upstream gets, recall remembered.
//
//   npm ci && node --test        (in tests/sdk/node, after `cargo build`)

import { describe, it, before, after, beforeEach } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import OpenAI from 'openai';

import { UPSTREAMS, SYSTEM_MESSAGE, startStack } from './stack.mjs';

const MODEL = 'gpt-4o-mini';
const API_KEY = 'sk-sdk-test';
const LLMOCK_PREFIX = 'Hello! You said: ';
// What scripted_upstream.py streams for "slow ...".
const SLOW_TEXT = 'slow reply: ' + Array.from({ length: 60 }, (_, i) => `word${i}`).join(' ');
const LONG_REPLY = Array.from({ length: 40 }, (_, i) => `piece${i}`).join(' ');

const WEATHER_TOOL = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Get the current weather for a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  },
};

const FAULTS = {
  // the connection is cut mid-body: a transport error
  disconnect: ['break off please', 'upstream stream broke off'],
  // the body ends cleanly, but with no finish_reason and no [DONE]
  truncate: ['truncate please', 'upstream stream ended before the reply was complete'],
};

const sid = (name) => `js-${name}-${randomUUID().slice(0, 8)}`;

const transcript = (messages) => messages.map((m) => [m.role, m.content]);

for (const kind of UPSTREAMS) {
  describe(`OpenAI Node SDK through recall, upstream: ${kind}`, () => {
    let stack;

    before(async () => {
      stack = await startStack(kind);
    });
    after(async () => {
      await stack?.stop();
    });
    beforeEach(async () => {
      await stack.reset();
    });

    /** A client naming its session by header, or by the base-URL form. */
    function client({ header, path, maxRetries = 0 } = {}) {
      return new OpenAI({
        baseURL: path ? `${stack.recallUrl}/sessions/${path}/v1` : `${stack.recallUrl}/v1`,
        apiKey: API_KEY,
        defaultHeaders: header ? { 'x-session-id': header } : undefined,
        maxRetries,
        timeout: 20_000,
      });
    }

    /** Sends one user message; returns the reply's text, checking its shape. */
    async function say(c, text, { stream, ...extra }) {
      const messages = [{ role: 'user', content: text }];
      if (!stream) {
        const r = await c.chat.completions.create({ model: MODEL, messages, ...extra });
        assert.equal(r.object, 'chat.completion');
        assert.equal(r.choices[0].finish_reason, 'stop');
        assert.equal(r.choices[0].message.role, 'assistant');
        return r.choices[0].message.content;
      }
      const s = await c.chat.completions.create({ model: MODEL, messages, stream: true, ...extra });
      let text_ = '';
      const finishes = [];
      for await (const chunk of s) {
        assert.equal(chunk.object, 'chat.completion.chunk');
        for (const choice of chunk.choices) {
          text_ += choice.delta.content ?? '';
          if (choice.finish_reason) finishes.push(choice.finish_reason);
        }
      }
      assert.deepEqual(finishes, ['stop']);
      return text_;
    }

    function expectAnswer(answer, said) {
      if (kind === 'scripted') assert.equal(answer, `echo: ${said}`);
      else assert.ok(answer.startsWith(LLMOCK_PREFIX), answer);
    }

    async function history(session) {
      const { status, body } = await stack.history(session);
      assert.equal(status, 200, JSON.stringify(body));
      return body.contents;
    }

    // -- (1) and (3): a conversation named by the header, streaming and not --

    it('remembers every turn of a header-named session, streamed or not', async () => {
      const id = sid('header');
      const c = client({ header: id });
      const turns = [
        ['My name is Ada.', false],
        ['I live in Paris.', true],
        ['what did I say first?', false],
      ];
      const expected = [['system', SYSTEM_MESSAGE]];
      let answer;
      for (const [n, [text, stream]] of turns.entries()) {
        answer = await say(c, text, { stream });
        expected.push(['user', text]);
        const got = await stack.received();
        assert.equal(got.length, n + 1);
        const last = got.at(-1);
        // The client sent one message; the upstream got the whole conversation.
        assert.deepEqual(transcript(last.messages), expected);
        assert.equal(last.model, MODEL);
        assert.equal(last.stream ?? false, stream);
        assert.ok(!('session_id' in last));
        expected.push(['assistant', answer]);
        if (n < 2) expectAnswer(answer, text);
      }
      // The SDK's answer itself depends on the first turn.
      if (kind === 'scripted') assert.equal(answer, 'You first said: My name is Ada.');
      else assert.ok(answer.startsWith(`${LLMOCK_PREFIX}${SYSTEM_MESSAGE} My name is Ada.`), answer);

      const h = await history(id);
      assert.deepEqual(transcript(h), expected.slice(1));
      assert.deepEqual(h.map((m) => m.turn_id), [1, 1, 2, 2, 3, 3]);
      assert.deepEqual(h.map((m) => m.metadata.source), ['message', 'llm', 'message', 'llm', 'message', 'llm']);

      if (kind === 'scripted') {
        // llmock's journal keeps no headers
        const headers = (await stack.receivedHeaders()).at(-1);
        assert.equal(headers.authorization, `Bearer ${API_KEY}`);
        assert.ok(!('x-session-id' in headers));
      }
    });

    // -- (2) the base-URL form ------------------------------------------------

    it('remembers through the base-URL session form and keeps sessions apart', async () => {
      const id = sid('path');
      const c = client({ path: id });
      const first = await say(c, 'Remember the number 42.', { stream: true, stream_options: { include_usage: true } });
      expectAnswer(first, 'Remember the number 42.');
      const second = await say(c, 'what did I say first?', { stream: false });
      assert.deepEqual(transcript((await stack.received()).at(-1).messages), [
        ['system', SYSTEM_MESSAGE],
        ['user', 'Remember the number 42.'],
        ['assistant', first],
        ['user', 'what did I say first?'],
      ]);
      if (kind === 'scripted') assert.equal(second, 'You first said: Remember the number 42.');
      else assert.ok(second.includes('Remember the number 42.'), second);

      // Another session on the same recall does not see this one.
      const other = await say(client({ header: `${id}-other` }), 'what did I say first?', { stream: false });
      assert.deepEqual(transcript((await stack.received()).at(-1).messages), [
        ['system', SYSTEM_MESSAGE],
        ['user', 'what did I say first?'],
      ]);
      if (kind === 'scripted') assert.equal(other, 'You first said: what did I say first?');

      assert.deepEqual(
        (await history(id)).map((m) => m.content),
        ['Remember the number 42.', first, 'what did I say first?', second],
      );
    });

    // -- (3) a stream relayed whole -------------------------------------------

    it('relays a stream whole, with its usage chunk', async () => {
      const id = sid('stream');
      const text = 'Tell me something in several words please.';
      const s = await client({ header: id }).chat.completions.create({
        model: MODEL,
        messages: [{ role: 'user', content: text }],
        stream: true,
        stream_options: { include_usage: true },
      });
      const chunks = [];
      for await (const chunk of s) chunks.push(chunk);
      assert.ok(chunks.length >= 4, JSON.stringify(chunks));
      assert.equal(chunks[0].choices[0].delta.role, 'assistant');
      assert.equal(new Set(chunks.map((ch) => ch.id)).size, 1);
      const finishes = chunks.flatMap((ch) => ch.choices.filter((x) => x.finish_reason).map((x) => x.finish_reason));
      assert.deepEqual(finishes, ['stop']);
      // The usage chunk comes last, with no choices.
      assert.deepEqual(chunks.at(-1).choices, []);
      assert.ok(chunks.at(-1).usage.total_tokens > 0);
      const contentChunks = chunks.filter((ch) => ch.choices[0]?.delta.content);
      assert.ok(contentChunks.length > 1, 'the reply should come in several chunks');
      const streamed = chunks.map((ch) => ch.choices[0]?.delta.content ?? '').join('');

      // The same message, not streamed, in a fresh session: the same answer.
      const plain = await say(client({ header: `${id}-plain` }), text, { stream: false });
      assert.equal(streamed, plain);
      expectAnswer(streamed, text);
      assert.deepEqual((await stack.received())[0].stream_options, { include_usage: true });

      // recall remembered exactly what was streamed.
      assert.deepEqual(transcript(await history(id)), [['user', text], ['assistant', streamed]]);
    });

    // -- (4) a tool call round trip -------------------------------------------

    for (const stream of [false, true]) {
      it(`remembers a tool call round trip in order (${stream ? 'streamed' : 'plain'})`, async () => {
        const id = sid(`tool-${stream}`);
        const c = client({ header: id });
        const ask = 'please call the weather tool for Paris';
        let calls;
        let finish;
        if (stream) {
          const s = await c.chat.completions.create({
            model: MODEL, messages: [{ role: 'user', content: ask }], tools: [WEATHER_TOOL], stream: true,
          });
          const byIndex = new Map();
          for await (const chunk of s) {
            for (const choice of chunk.choices) {
              for (const d of choice.delta.tool_calls ?? []) {
                const call = byIndex.get(d.index) ?? { id: null, name: '', arguments: '' };
                if (d.id) call.id = d.id;
                call.name += d.function?.name ?? '';
                call.arguments += d.function?.arguments ?? '';
                byIndex.set(d.index, call);
              }
              finish = choice.finish_reason ?? finish;
            }
          }
          calls = [...byIndex.keys()].sort().map((k) => byIndex.get(k));
        } else {
          const r = await c.chat.completions.create({
            model: MODEL, messages: [{ role: 'user', content: ask }], tools: [WEATHER_TOOL],
          });
          finish = r.choices[0].finish_reason;
          calls = (r.choices[0].message.tool_calls ?? []).map((t) => ({
            id: t.id, name: t.function.name, arguments: t.function.arguments,
          }));
        }
        assert.equal(finish, 'tool_calls');
        assert.equal(calls.length, 1);
        const [call] = calls;
        assert.equal(call.name, 'get_weather');
        assert.ok(call.id);
        assert.equal(typeof JSON.parse(call.arguments), 'object');
        if (kind === 'scripted') assert.deepEqual(JSON.parse(call.arguments), { city: 'Paris' });

        // The client sends only the tool's result; recall supplies the rest.
        const result = '{"city": "Paris", "temp_c": 21}';
        const toolMsg = { role: 'tool', tool_call_id: call.id, content: result };
        let final;
        if (stream) {
          const s = await c.chat.completions.create({ model: MODEL, messages: [toolMsg], tools: [WEATHER_TOOL], stream: true });
          final = '';
          for await (const chunk of s) final += chunk.choices.map((x) => x.delta.content ?? '').join('');
        } else {
          const r = await c.chat.completions.create({ model: MODEL, messages: [toolMsg], tools: [WEATHER_TOOL] });
          assert.equal(r.choices[0].finish_reason, 'stop');
          assert.ok(!r.choices[0].message.tool_calls?.length);
          final = r.choices[0].message.content;
        }
        if (kind === 'scripted') assert.equal(final, `tool result received: ${result}`);
        else assert.ok(final.startsWith(LLMOCK_PREFIX) && final.includes(result), final);

        const sent = (await stack.received()).at(-1).messages;
        assert.deepEqual(sent.map((m) => m.role), ['system', 'user', 'assistant', 'tool']);
        assert.equal(sent[1].content, ask);
        assert.deepEqual(sent[2].tool_calls.map((t) => t.id), [call.id]);
        assert.deepEqual(sent[2].tool_calls[0].function, { name: 'get_weather', arguments: call.arguments });
        assert.deepEqual(sent[3], toolMsg);

        const h = await history(id);
        assert.deepEqual(h.map((m) => m.role), ['user', 'assistant', 'tool', 'assistant']);
        assert.equal(h[0].content, ask);
        assert.equal(h[1].tool_calls[0].id, call.id);
        assert.equal(h[1].tool_calls[0].function.name, 'get_weather');
        assert.equal(h[2].tool_call_id, call.id);
        assert.equal(h[2].content, result);
        assert.equal(h[3].content, final);
        assert.ok(!h[3].tool_calls);
        assert.deepEqual(h.map((m) => m.turn_id), [1, 1, 1, 1]);
      });
    }

    // -- (5) a stream the client closes early ---------------------------------

    it('records a stream the client closes early as interrupted', async () => {
      const id = sid('early');
      const c = client({ header: id });
      let ask;
      let full;
      if (kind === 'scripted') {
        ask = 'slow story please';
        full = SLOW_TEXT;
      } else {
        ask = 'tell me a long story';
        full = LONG_REPLY;
        // The role chunk and 3 words go out, then llmock pauses long enough
        // for the client to hang up in the middle of the reply.
        await stack.llmock(
          { type: 'reply', text: full },
          { type: 'stream_fault', kind: 'stall', after_chunks: 4, stall_seconds: 2.0 },
        );
      }
      const s = await c.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: ask }], stream: true });
      let read = '';
      let pieces = 0;
      for await (const chunk of s) {
        const delta = chunk.choices[0]?.delta.content;
        if (delta) {
          read += delta;
          pieces += 1;
        }
        if (pieces === 3) break; // leaving the loop aborts the request
      }
      assert.ok(s.controller.signal.aborted, 'breaking out aborted the stream');
      assert.ok(read && full.startsWith(read));

      const interrupted = (cs) => cs.length >= 2 && cs[1].metadata?.interrupted === true;
      let h = await stack.waitHistory(id, interrupted, { what: 'the interrupted reply' });
      const cut = h[1];
      assert.deepEqual(h.map((m) => m.role), ['user', 'assistant']);
      assert.equal(h[0].content, ask);
      assert.equal(cut.metadata.source, 'llm');
      assert.ok(Number.isInteger(cut.metadata.interrupt_timestamp));
      assert.ok(cut.metadata.interrupt_timestamp >= cut.timestamp);
      // content is what went out to the client: at least what it read, never the whole reply.
      assert.ok(cut.content.startsWith(read), `${cut.content} / ${read}`);
      assert.ok(full.startsWith(cut.content) && cut.content.length < full.length);
      if (kind === 'llmock') {
        // llmock paused right after those chunks: nothing more went out.
        assert.equal(cut.content, read);
        assert.equal(cut.metadata.original_complete, false);
      }

      // recall keeps reading the upstream and completes the original.
      h = await stack.waitHistory(id, (cs) => cs[1].metadata.original_complete === true, {
        within: 15_000,
        what: 'the complete original',
      });
      assert.equal(h[1].metadata.original, full);
      assert.equal(h[1].content, cut.content);
      assert.equal(h[1].metadata.interrupted, true);

      // The next turn shows the model what was actually said.
      await say(c, 'and then?', { stream: false });
      const sent = (await stack.received()).at(-1).messages;
      assert.deepEqual(transcript(sent).slice(1), [['user', ask], ['assistant', cut.content], ['user', 'and then?']]);
    });

    // -- (6) errors arrive as the SDK's own exceptions -------------------------

    it("rejects a bad session id with the SDK's BadRequestError", async () => {
      await assert.rejects(say(client({ header: 'bad id' }), 'hello', { stream: false }), (e) => {
        assert.ok(e instanceof OpenAI.BadRequestError, e);
        assert.equal(e.status, 400);
        assert.match(e.message, /a session id is 1 to 128 characters/);
        assert.equal(e.type, 'invalid_request_error');
        assert.equal(e.param, 'x-session-id');
        return true;
      });
      await assert.rejects(say(client({ path: 'bad%01id' }), 'hello', { stream: true }), (e) => {
        assert.ok(e instanceof OpenAI.BadRequestError, e);
        assert.match(e.message, /a session id is 1 to 128 characters/);
        assert.equal(e.param, 'session_id');
        return true;
      });
      assert.deepEqual(await stack.received(), []);
    });

    it("relays an upstream 4xx as the SDK's BadRequestError", async () => {
      const id = sid('4xx');
      let text;
      let message;
      if (kind === 'scripted') {
        text = 'fail 400 too hot';
        message = 'scripted upstream failure (400): fail 400 too hot';
      } else {
        text = 'anything';
        message = 'llmock refuses this request';
        await stack.llmock({ type: 'fail', status: 400, message, code: 'llmock_no' });
      }
      await assert.rejects(say(client({ header: id }), text, { stream: false }), (e) => {
        assert.ok(e instanceof OpenAI.BadRequestError, e);
        assert.equal(e.status, 400);
        assert.ok(e.message.includes(message), e.message);
        return true;
      });
      // The failed call kept the user's message, and nothing else.
      assert.deepEqual(transcript(await history(id)), [['user', text]]);
    });

    for (const stream of [false, true]) {
      it(`retries an upstream 5xx, then raises InternalServerError, without duplicating the message (${stream ? 'streamed' : 'plain'})`, async () => {
        const id = sid(`5xx-${stream}`);
        let text;
        let message;
        if (kind === 'scripted') {
          text = 'fail again';
          message = 'scripted upstream failure (500): fail again';
        } else {
          text = 'anything';
          message = 'llmock is down';
          await stack.llmock({ type: 'fail', status: 500, message, retry_after: 0.02, times: 2 });
        }
        await assert.rejects(say(client({ header: id, maxRetries: 1 }), text, { stream }), (e) => {
          assert.ok(e instanceof OpenAI.InternalServerError, e);
          assert.equal(e.status, 500);
          assert.ok(e.message.includes(message), e.message);
          return true;
        });
        const got = await stack.received();
        assert.equal(got.length, 2, 'the SDK retried once');
        assert.deepEqual(got[0].messages, got[1].messages);
        assert.deepEqual(transcript(await history(id)), [['user', text]]);
      });
    }

    /** Streams a reply the upstream breaks after a few words. */
    async function brokenStream(c, fault) {
      let [text] = FAULTS[fault];
      if (kind === 'llmock') {
        text = 'one two three four five six seven';
        await stack.llmock({ type: 'stream_fault', kind: fault, after_chunks: 4 });
      }
      let read = '';
      let error;
      try {
        const s = await c.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: text }], stream: true });
        for await (const chunk of s) read += chunk.choices.map((x) => x.delta.content ?? '').join('');
      } catch (e) {
        error = e;
      }
      assert.ok(error, 'the SDK raised');
      return { text, read, error };
    }

    for (const fault of Object.keys(FAULTS)) {
      it(`raises on a stream the upstream breaks (${fault}) and records it as interrupted`, async () => {
        const id = sid(`broken-${fault}`);
        const { text, read, error } = await brokenStream(client({ header: id }), fault);
        // The stream had begun with a 200: recall sent an SSE error event.
        assert.ok(error instanceof OpenAI.APIError, error);
        assert.equal(error.status, undefined);
        assert.ok(error.message.includes(FAULTS[fault][1]), error.message);
        assert.equal(error.code, 'stream_broken');
        assert.equal(error.type, 'upstream_error');
        assert.ok(read, 'some text arrived before the break');
        if (kind === 'llmock') assert.equal(read, 'Hello! You said: ');

        const h = await history(id);
        assert.deepEqual(h.map((m) => m.role), ['user', 'assistant']);
        assert.equal(h[0].content, text);
        const meta = h[1].metadata;
        assert.equal(meta.interrupted, true);
        assert.equal(meta.original_complete, false);
        assert.ok(meta.error.includes(FAULTS[fault][1]), meta.error);
        assert.equal(meta.original, read); // all that arrived before the break
        assert.ok(read.startsWith(h[1].content));
      });

      it(`stores all the client was sent when the upstream breaks (${fault})`, async () => {
        for (let i = 0; i < 10; i++) {
          const id = sid(`exact-${fault}-${i}`);
          const { read } = await brokenStream(client({ header: id }), fault);
          const h = await history(id);
          assert.equal(h[1].content, read, `round ${i}: the client got ${JSON.stringify(read)}, recall stored ${JSON.stringify(h[1])}`);
        }
      });
    }
  });
}
