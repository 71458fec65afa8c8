// Drives a Tether server with the official AG-UI client (@ag-ui/client's HttpAgent), for
// tests/test_agui.py. Usage: node agui_client.cjs <node_modules dir>  < scenario.json
//
// The scenario: {url, threadId, legacy?, steps: [step, ...]}. Steps run in order on one agent:
//   {op: "run", message?, answer?, repeatResume?, forwardedProps?, cancelAfter?, cutAfter?}
//       agent.addMessage(user message) when `message` is given, then agent.runAgent(...).
//       answer: {status, payload?}: resume every pending interrupt with it.
//       repeatResume: send the previous step's resume again.
//       cancelAfter: {type, count}: once `count` events of `type` arrived, cancel the run through
//         Tether's API (POST /v1/runs/{run_id}/cancel, the run id from metadata.tether).
//       cutAfter: {type, count} or {dotted: true, type}: the network drops right after that
//         frame (the response body ends cleanly there, as a dead connection looks to fetch).
//   {op: "connect"}  agent.connectAgent(): POST /v1/agui/connect with Last-Event-ID = the
//       last metadata.tether.event_id this agent saw.
// Prints {steps: [...], messages, pendingInterrupts, captures} as JSON: per step the events
// the agent's subscribers saw (after the client's own verification), the RUN_FINISHED
// outcomes, RUN_ERRORs and whether the run threw; captures are the raw SSE text of every
// response, for ag-ui-validate.
"use strict";

const path = require("node:path");

const modules = process.argv[2];
const { HttpAgent, runHttpRequest, transformHttpEventStream } = require(path.join(modules, "@ag-ui", "client"));

const captures = [];
let cutRule = null; // set by a "run" step, used by the next response

function frameMatches(rule, frame, counts) {
  const data = frame
    .split("\n")
    .filter((line) => line.startsWith("data:"))
    .map((line) => line.slice(5).replace(/^ /, ""))
    .join("\n");
  if (!data) return false;
  const event = JSON.parse(data);
  if (rule.type && event.type !== rule.type) return false;
  const id = (frame.match(/^id: (.*)$/m) || [])[1] || "";
  if (rule.dotted && !id.includes(".")) return false;
  counts.n += 1;
  return counts.n >= (rule.count || 1);
}

// fetch, keeping a copy of every response body, and cutting it where the scenario says.
async function recordingFetch(url, init) {
  const response = await fetch(url, init);
  const capture = { url: String(url), status: response.status, text: "", cut: false };
  captures.push(capture);
  if (!response.body) return response;
  const rule = cutRule;
  cutRule = null;
  const counts = { n: 0 };
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  const encoder = new TextEncoder();
  let buffer = "";
  let stopped = false;
  const body = new ReadableStream({
    async pull(controller) {
      for (;;) {
        if (stopped) return;
        const { done, value } = await reader.read();
        if (done) {
          if (buffer) {
            capture.text += buffer;
            controller.enqueue(encoder.encode(buffer));
          }
          controller.close();
          return;
        }
        buffer += decoder.decode(value, { stream: true });
        let forwarded = false;
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          const frame = buffer.slice(0, end + 2);
          buffer = buffer.slice(end + 2);
          capture.text += frame;
          controller.enqueue(encoder.encode(frame));
          forwarded = true;
          if (rule && frameMatches(rule, frame, counts)) {
            stopped = true;
            capture.cut = true;
            reader.cancel().catch(() => {});
            controller.close();
            return;
          }
        }
        if (forwarded) return;
      }
    },
    cancel() {
      reader.cancel().catch(() => {});
    },
  });
  return new Response(body, { status: response.status, headers: response.headers });
}

class TetherAgent extends HttpAgent {
  constructor(config) {
    super(config);
    this.lastEventId = undefined;
    this.tetherRunId = undefined;
  }

  // AG-UI's HttpAgent has no connect(): reattach through Tether's /v1/agui/connect, resuming
  // after the last event id seen (AG-UI's client reads no SSE ids; metadata.tether has them).
  connect(input) {
    const init = this.requestInit(input);
    init.headers = { ...init.headers };
    if (this.lastEventId !== undefined) init.headers["Last-Event-ID"] = this.lastEventId;
    return transformHttpEventStream(runHttpRequest(() => this.fetch(`${this.url}/connect`, init)));
  }
}

// A client from before AG-UI 1.0: it declares no protocolVersion.
class LegacyAgent extends TetherAgent {
  get maxProtocolVersion() {
    return "0.0.59";
  }
}

async function main() {
  let input = "";
  for await (const chunk of process.stdin) input += chunk;
  const scenario = JSON.parse(input);
  const Agent = scenario.legacy ? LegacyAgent : TetherAgent;
  const agent = new Agent({ url: `${scenario.url}/v1/agui`, threadId: scenario.threadId, fetch: recordingFetch });
  const steps = [];
  let counter = 0;
  let lastResume;
  for (const step of scenario.steps) {
    const record = { op: step.op, events: [], finished: [], errors: [], threw: null, result: undefined };
    const cancel = step.cancelAfter ? { ...step.cancelAfter, seen: 0, sent: false } : null;
    const subscriber = {
      onEvent: async ({ event }) => {
        record.events.push(event);
        const tether = event.metadata && event.metadata.tether;
        if (tether && tether.event_id !== undefined) agent.lastEventId = tether.event_id;
        if (tether && tether.run_id) agent.tetherRunId = tether.run_id;
        if (cancel && !cancel.sent && event.type === cancel.type && ++cancel.seen >= (cancel.count || 1)) {
          cancel.sent = true;
          const response = await fetch(`${scenario.url}/v1/runs/${agent.tetherRunId}/cancel`, {
            method: "POST",
            headers: { "Content-Type": "application/json" },
            body: JSON.stringify({ mode: "soft", reason: "user pressed stop" }),
          });
          record.cancelStatus = response.status;
        }
      },
      onRunFinishedEvent: ({ outcome, interrupts, result }) => {
        record.finished.push({ outcome, interrupts, result });
      },
      onRunErrorEvent: ({ event }) => {
        record.errors.push({ code: event.code, message: event.message, metadata: event.metadata });
      },
    };
    try {
      if (step.op === "run") {
        if (step.message !== undefined) agent.addMessage({ id: `client-${++counter}`, role: "user", content: step.message });
        cutRule = step.cutAfter || null;
        const params = {};
        if (step.answer) params.resume = agent.pendingInterrupts.map((i) => ({ interruptId: i.id, ...step.answer }));
        if (step.repeatResume) params.resume = lastResume;
        if (params.resume) lastResume = params.resume;
        record.resume = params.resume;
        if (step.forwardedProps) params.forwardedProps = step.forwardedProps;
        const out = await agent.runAgent(params, subscriber);
        record.result = out.result;
        record.newMessages = out.newMessages;
      } else if (step.op === "connect") {
        const params = step.forwardedProps ? { forwardedProps: step.forwardedProps } : {};
        await agent.connectAgent(params, subscriber);
      } else {
        throw new Error(`unknown op ${step.op}`);
      }
    } catch (error) {
      record.threw = String(error && error.message ? error.message : error);
    }
    record.lastEventId = agent.lastEventId;
    record.pendingInterrupts = agent.pendingInterrupts;
    steps.push(record);
  }
  process.stdout.write(JSON.stringify({ steps, messages: agent.messages, pendingInterrupts: agent.pendingInterrupts, captures }));
}

main().catch((error) => {
  process.stderr.write(String(error && error.stack ? error.stack : error));
  process.exit(1);
});
