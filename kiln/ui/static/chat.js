// One assistant turn: the chat-completions request the settings make, sent streaming (SSE) or,
// for exact rollout provenance, as one JSON request; the reply gathered into a message whose
// meta holds what the page shows and what the provenance download carries.
"use strict";

const KilnChat = (() => {
  const num = (v) => (v === "" || v == null ? null : Number(v));

  // settings (from the side panel) + history -> the request body; throws Error on bad JSON
  function requestBody(history, s) {
    const messages = [];
    if (s.system) messages.push({ role: "system", content: s.system });
    for (const m of history) {
      const meta = m.meta || {};
      if (m.role === "assistant" && meta.tool_calls && meta.tool_calls.length) {
        messages.push({ role: "assistant", content: m.content || null, tool_calls: meta.tool_calls.map((c) => ({
          id: c.id, type: "function", function: { name: c.function.name, arguments: c.function.arguments } })) });
      } else if (m.role === "tool") {
        messages.push({ role: "tool", content: m.content, tool_call_id: meta.tool_call_id });
      } else if (m.role === "user" || m.role === "assistant" || m.role === "system") {
        messages.push({ role: m.role, content: m.content });
      }
    }
    const body = { messages, stream: !s.exact };
    for (const key of ["temperature", "top_p", "top_k", "seed", "max_tokens"]) {
      const v = num(s[key]);
      if (v !== null && !Number.isNaN(v)) body[key] = v;
    }
    if (s.preset) body.sampling_preset = s.preset;
    const budget = num(s.budget);
    if (budget !== null && !Number.isNaN(budget)) {
      body[s.budgetUnit === "ms" ? "thinking_budget_ms" : "thinking_budget_tokens"] = budget;
    }
    if (s.logprobs) { body.logprobs = true; body.top_logprobs = 5; }
    body.return_token_ids = true;
    if (s.exact) body.rollout_provenance = true;
    else body.stream_options = { include_usage: true };
    if (s.schema && s.schema.trim()) {
      let schema;
      try { schema = JSON.parse(s.schema); } catch (e) { throw new Error(`the JSON schema is not JSON: ${e.message}`); }
      body.response_format = { type: "json_schema", json_schema: { name: "output", schema } };
    }
    if (s.tools && s.tools.trim()) {
      try { body.tools = JSON.parse(s.tools); } catch (e) { throw new Error(`the tools are not JSON: ${e.message}`); }
      if (s.tool_choice) body.tool_choice = s.tool_choice;
    }
    if (s.compose && s.compose.trim()) { // y = Wx + sum of scale_i * B_i A_i x
      if (s.adapter) throw new Error("choose one adapter or a composition, not both");
      body.adapters = s.compose.split(",").map((part) => {
        const [name, scale] = part.split("=").map((x) => x.trim());
        const value = scale === undefined || scale === "" ? 1 : Number(scale);
        if (!name || Number.isNaN(value)) throw new Error(`not an adapter and its scale: ${part.trim()}`);
        return { name, scale: value };
      });
    } else if (s.adapter) body.adapter = s.adapter;
    return body;
  }

  function fresh(body) {
    return {
      role: "assistant", content: "", reasoning_content: "",
      meta: { request: body, logprobs: [], token_ids: [], tool_calls: [], server: {} },
    };
  }

  function addLogprobs(meta, lp) {
    for (const c of (lp && lp.content) || []) {
      meta.logprobs.push({ t: c.token, p: c.logprob, top: (c.top_logprobs || []).map((a) => [a.token, a.logprob]) });
    }
  }

  function addToolCalls(meta, deltas) {
    for (const d of deltas || []) {
      const at = d.index ?? meta.tool_calls.length;
      const call = meta.tool_calls[at] || (meta.tool_calls[at] = { id: d.id, type: "function", function: { name: "", arguments: "" } });
      if (d.id) call.id = d.id;
      if (d.function && d.function.name) call.function.name += d.function.name;
      if (d.function && d.function.arguments) call.function.arguments += d.function.arguments;
    }
  }

  function finish(msg, t0, tFirst, tEnd) {
    const meta = msg.meta;
    const n = meta.server.usage ? meta.server.usage.completion_tokens : meta.token_ids.length;
    meta.completion_tokens = n;
    if (tFirst !== null) {
      meta.ttft_ms = tFirst - t0;
      if (n > 1 && tEnd > tFirst) meta.tokens_per_s = (n - 1) / ((tEnd - tFirst) / 1000);
    }
    if (!meta.tool_calls.length) delete meta.tool_calls;
    if (!msg.reasoning_content) msg.reasoning_content = null;
  }

  // Streams one turn; onUpdate(msg) after each event. Resolves with the message, also when
  // stopped (signal aborted: meta.finish_reason "stopped") or failed (meta.error).
  async function stream(body, signal, onUpdate) {
    const msg = fresh(body);
    const meta = msg.meta;
    const t0 = performance.now();
    let tFirst = null;
    try {
      const res = await KilnApi.request("POST", "/v1/chat/completions", body, { signal, raw: true });
      await KilnApi.readEvents(res, (ev) => {
        if (ev.error) { meta.error = ev.error.message; return; }
        if (ev.object !== "chat.completion.chunk") return; // e.g. kiln.token_timing
        const s = meta.server;
        s.id = ev.id; s.model = ev.model;
        if (ev.prompt_token_ids) s.prompt_token_ids = ev.prompt_token_ids;
        if (ev.kiln_metadata) s.kiln_metadata = ev.kiln_metadata;
        if (ev.weight_version) s.weight_version = ev.weight_version;
        if (ev.usage) s.usage = ev.usage;
        const choice = (ev.choices || [])[0];
        if (!choice) return;
        const d = choice.delta || {};
        if (d.content || d.reasoning_content || d.tool_calls) tFirst = tFirst ?? performance.now();
        if (d.content) msg.content += d.content;
        if (d.reasoning_content) msg.reasoning_content += d.reasoning_content;
        addToolCalls(meta, d.tool_calls);
        addLogprobs(meta, choice.logprobs);
        if (choice.token_ids) meta.token_ids.push(...choice.token_ids);
        if (choice.finish_reason) meta.finish_reason = choice.finish_reason;
        onUpdate(msg);
      });
    } catch (e) {
      if (e.name === "AbortError") meta.finish_reason = "stopped";
      else meta.error = e.message;
    }
    finish(msg, t0, tFirst, performance.now());
    return msg;
  }

  // One non-streaming turn (exact rollout provenance).
  async function once(body, signal) {
    const msg = fresh(body);
    const meta = msg.meta;
    const t0 = performance.now();
    try {
      const res = await KilnApi.post("/v1/chat/completions", body, { signal });
      const choice = res.choices[0];
      msg.content = choice.message.content || "";
      msg.reasoning_content = choice.message.reasoning_content || "";
      addToolCalls(meta, (choice.message.tool_calls || []).map((c, i) => ({ ...c, index: i })));
      addLogprobs(meta, choice.logprobs);
      meta.token_ids = choice.token_ids || [];
      meta.finish_reason = choice.finish_reason;
      if (choice.rollout_provenance) meta.rollout_provenance = choice.rollout_provenance;
      Object.assign(meta.server, { id: res.id, model: res.model, usage: res.usage,
        prompt_token_ids: res.prompt_token_ids, kiln_metadata: res.kiln_metadata,
        weight_version: res.weight_version, system_fingerprint: res.system_fingerprint });
    } catch (e) {
      if (e.name === "AbortError") meta.finish_reason = "stopped";
      else meta.error = e.message;
    }
    const t = performance.now();
    finish(msg, t0, null, t);
    if (meta.completion_tokens) meta.tokens_per_s = meta.completion_tokens / ((t - t0) / 1000);
    return msg;
  }

  // The provenance record of message i of a conversation, as downloaded.
  function provenance(conversation, i) {
    const m = conversation.messages[i];
    const meta = m.meta || {};
    return {
      object: "kiln.ui.message_provenance",
      conversation_id: conversation.id,
      message_index: i,
      request: meta.request || null,
      response: {
        content: m.content, reasoning_content: m.reasoning_content || null,
        tool_calls: meta.tool_calls || null, finish_reason: meta.finish_reason || null,
        token_ids: meta.token_ids || null, logprobs: meta.logprobs && meta.logprobs.length ? meta.logprobs : null,
        ...(meta.server || {}),
      },
      timings: { ttft_ms: meta.ttft_ms ?? null, tokens_per_s: meta.tokens_per_s ?? null,
        completion_tokens: meta.completion_tokens ?? null },
      rollout_provenance: meta.rollout_provenance || null,
    };
  }

  return { requestBody, stream, once, provenance };
})();
