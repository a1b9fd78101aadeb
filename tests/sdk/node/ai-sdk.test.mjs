// recall end to end through Vercel's AI SDK (`ai` with
// `@ai-sdk/openai-compatible`), which keeps the conversation itself and
// resends it whole every call, as a web app's chat does:
// - generateText over a resent history: each message stored once;
// - streamText aborted mid-reply with an AbortController (the user pressed
//   stop): the reply stored as interrupted with its complete original;
// - the text heard resent on the next turn: the record says what was heard,
//   and nothing is stored twice.
//
// Every test runs against the scripted upstream ("stall ..." streams three
// words, then pauses) and against llmock (a stall queued), so the abort lands
// mid-reply.

import { describe, it, before, after, beforeEach } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { generateText, streamText } from 'ai';

import { UPSTREAMS, SYSTEM_MESSAGE, startStack } from './stack.mjs';

const MODEL = 'gpt-4o-mini';
const API_KEY = 'sk-sdk-test';
const PROMPT = 'You are a helpful assistant.';
const STALL = { type: 'stream_fault', kind: 'stall', after_chunks: 4, stall_seconds: 1.5 };

const sid = (name) => `ai-${name}-${randomUUID().slice(0, 8)}`;
const text = (content) =>
  typeof content === 'string' ? content : (content ?? []).map((p) => p.text ?? '').join('');
const transcript = (messages) => messages.map((m) => [m.role, text(m.content)]);

for (const kind of UPSTREAMS) {
  describe(`Vercel AI SDK through recall, upstream: ${kind}`, () => {
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

    /** The model, its session named in the base URL. */
    function model(session) {
      const recall = createOpenAICompatible({
        name: 'recall',
        baseURL: `${stack.recallUrl}/sessions/${session}/v1`,
        apiKey: API_KEY,
      });
      return recall.chatModel(MODEL);
    }

    async function history(session) {
      const { status, body } = await stack.history(session);
      assert.equal(status, 200, JSON.stringify(body));
      return body.contents;
    }

    it('generateText over a resent history stores each message once', async () => {
      const id = sid('generate');
      const messages = [];
      const said = ['My name is Ada.', 'I live in Paris.', 'what did I say first?'];
      for (const line of said) {
        messages.push({ role: 'user', content: line });
        const r = await generateText({ model: model(id), system: PROMPT, messages, maxRetries: 0 });
        messages.push(...r.response.messages);
      }
      const h = await history(id);
      assert.deepEqual(transcript(h), transcript(messages));
      assert.deepEqual(h.map((m) => m.role), ['user', 'assistant', 'user', 'assistant', 'user', 'assistant']);
      if (kind === 'scripted') assert.equal(h.at(-1).content, 'You first said: My name is Ada.');

      const got = await stack.received();
      assert.equal(got.length, 3);
      // The upstream got what the app sent, each message once.
      assert.deepEqual(transcript(got[2].messages), [
        ['system', SYSTEM_MESSAGE],
        ['system', PROMPT],
        ...transcript(messages.slice(0, -1)),
      ]);
    });

    it('streamText aborted mid-reply is stored as heard, and the heard text resent adds nothing twice', async () => {
      const id = sid('abort');
      if (kind === 'llmock') await stack.llmock(STALL);
      const first = { role: 'user', content: 'stall: tell me a story' };
      const stop = new AbortController();
      const result = streamText({
        model: model(id),
        system: PROMPT,
        messages: [first],
        abortSignal: stop.signal,
        maxRetries: 0,
        onError: () => {},
      });
      let heard = '';
      try {
        for await (const delta of result.textStream) {
          heard += delta;
          if (heard.trim()) stop.abort(); // the user presses stop
        }
      } catch (e) {
        if (e.name !== 'AbortError') throw e;
      }
      assert.ok(heard.trim(), 'some of the reply arrived before the stop');

      // Recorded at once as interrupted, then the drain completes the original.
      const cut = (await stack.waitHistory(id, (c) => c[1]?.metadata?.original_complete === true, {
        within: 15_000,
        what: 'the cut reply with its complete original',
      }))[1];
      assert.equal(cut.metadata.interrupted, true, JSON.stringify(cut));
      assert.ok(cut.content.startsWith(heard), `${cut.content} was relayed, ${heard} heard`);
      assert.ok(cut.metadata.original.startsWith(cut.content));
      assert.ok(cut.metadata.original.length > cut.content.length, 'cut mid-reply');

      // The app keeps what the user saw, and goes on.
      const next = { role: 'user', content: 'a joke instead' };
      const messages = [first, { role: 'assistant', content: heard }, next];
      const r = await generateText({ model: model(id), system: PROMPT, messages, maxRetries: 0 });

      const h = await history(id);
      assert.deepEqual(transcript(h), [...transcript(messages), ['assistant', r.text]]);
      assert.equal(h[1].content, heard, 'the record says what was heard');
      assert.equal(h[1].metadata.original, cut.metadata.original);
      // Stopped, then the next turn: the user cut the reply off.
      assert.equal(h[1].metadata.cut_by, 'new_request');
      const got = await stack.received();
      assert.equal(got.length, 2);
      assert.deepEqual(transcript(got[1].messages), [
        ['system', SYSTEM_MESSAGE],
        ['system', PROMPT],
        ...transcript(messages),
      ]);
    });
  });
}
