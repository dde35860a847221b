// A payments agent written in Node, the way people write one: the official `openai` npm
// SDK talks to the model (OPENAI_BASE_URL), and its tools call the service with fetch.
// Nothing in it knows stenograph: every byte it exchanges is on the socket tape.
//
//     node payments_agent.cjs EFFECT_URL
const OpenAI = require("openai");

const BASE = process.argv[2];
const tools = ["pay", "provision"].map((name) => ({
  type: "function",
  function: {
    name, description: name,
    parameters: {
      type: "object",
      properties: name === "pay"
        ? { amount: { type: "string" }, to: { type: "string" } }
        : { name: { type: "string" } },
    },
  },
}));

async function post(path, body, headers) {
  try {
    const r = await fetch(BASE + path, {
      method: "POST", body: JSON.stringify(body),
      headers: Object.assign({ "Content-Type": "application/json" }, headers || {}),
    });
    return await r.text();
  } catch (e) {
    return "failed: " + e;
  }
}

async function run(name, args) {
  if (name === "pay") {
    const key = args.to === "acct-K" ? { "Idempotency-Key": `own-${args.to}-1` } : {};
    return post("/payments", { amount: Number(args.amount), to: args.to }, key);
  }
  return post("/servers", { name: args.name });
}

async function main() {
  const client = new OpenAI({ baseURL: process.env.OPENAI_BASE_URL, apiKey: "test-key" });
  const messages = [{ role: "user", content: "settle the invoices" }];
  for (let i = 0; i < 40; i++) {
    const reply = await client.chat.completions.create({ model: "steno-pay", messages, tools });
    const msg = reply.choices[0].message;
    if (!msg.tool_calls || msg.tool_calls.length === 0) {
      console.log("done:", msg.content);
      return 0;
    }
    messages.push(msg);
    for (const call of msg.tool_calls) {
      const args = JSON.parse(call.function.arguments);
      const out = await run(call.function.name, args);
      console.log(call.function.name, JSON.stringify(args), "->", out);
      messages.push({ role: "tool", tool_call_id: call.id, content: out });
    }
  }
  return 1;
}

main().then((code) => process.exit(code));
