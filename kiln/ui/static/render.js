// How one message looks: its text (Markdown, or tokens coloured by probability in the logprob
// view), its reasoning apart in a folded block, its figures (TTFT, tokens/s, token count,
// finish reason) and its actions (edit, regenerate, download provenance).
"use strict";

const KilnRender = (() => {
  const { escapeHtml } = KilnMarkdown;

  function el(tag, attrs = {}, children = []) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) {
      if (k === "text") node.textContent = v;
      else if (k === "html") node.innerHTML = v; // only ever our own escaped HTML
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else if (v !== undefined && v !== null && v !== false) node.setAttribute(k, v === true ? "" : v);
    }
    for (const c of children) if (c) node.append(c);
    return node;
  }

  // a probability in [0, 1] -> a background from red (unlikely) through yellow to green
  function probColour(p) {
    const hue = Math.round(120 * Math.max(0, Math.min(1, p)));
    return `hsl(${hue} 70% 80%)`;
  }

  function logprobView(tokens) {
    const box = el("div", { class: "tokens" });
    for (const t of tokens) {
      const p = Math.exp(t.p);
      const alts = (t.top || []).map(([tok, lp]) => `${JSON.stringify(tok)}  ${(100 * Math.exp(lp)).toFixed(1)}%`);
      const span = el("span", {
        class: "tok", text: t.t,
        title: `${JSON.stringify(t.t)}  ${(100 * p).toFixed(1)}%\n${alts.join("\n")}`,
        "data-p": p.toFixed(4),
      });
      span.style.backgroundColor = probColour(p); // CSSOM: the page's CSP refuses style attributes
      box.append(span);
    }
    return box;
  }

  function stats(meta) {
    const bits = [];
    if (meta.ttft_ms != null) bits.push(`TTFT ${meta.ttft_ms.toFixed(0)} ms`);
    if (meta.tokens_per_s != null) bits.push(`${meta.tokens_per_s.toFixed(1)} tok/s`);
    if (meta.completion_tokens != null) bits.push(`${meta.completion_tokens} tokens`);
    if (meta.finish_reason) bits.push(meta.finish_reason === "stopped" ? "stopped" : `finish: ${meta.finish_reason}`);
    if (meta.server && meta.server.performance && meta.server.performance.ttft_ms != null) {
      bits.push(`server TTFT ${meta.server.performance.ttft_ms.toFixed(0)} ms`);
    }
    return el("div", { class: "stats", text: bits.join(" · ") });
  }

  // One message. `h`: {edit(i), regenerate(i), provenance(i), toolResults(i), saveEdit(i, text),
  // cancelEdit()};
  // `opts`: {streaming, editing, logprobView, last}
  function message(msg, i, h, opts = {}) {
    const meta = msg.meta || {};
    const box = el("article", { class: `msg ${msg.role}`, "data-index": i });
    box.append(el("div", { class: "role", text: msg.role }));
    if (opts.editing) {
      const area = el("textarea", { class: "edit-area", rows: 4 });
      area.value = msg.content;
      box.append(area, el("div", { class: "actions" }, [
        el("button", { type: "button", class: "save-edit", text: "Save and send", onclick: () => h.saveEdit(i, area.value) }),
        el("button", { type: "button", text: "Cancel", onclick: () => h.cancelEdit() }),
      ]));
      return box;
    }
    if (msg.reasoning_content) {
      const think = el("details", { class: "reasoning", open: opts.streaming && !msg.content ? true : undefined });
      think.append(el("summary", { text: opts.streaming && !msg.content ? "Thinking…" : "Thinking" }),
        el("div", { class: "reasoning-text", text: msg.reasoning_content }));
      box.append(think);
    }
    if (msg.role === "assistant" && opts.logprobView && meta.logprobs && meta.logprobs.length) {
      box.append(logprobView(meta.logprobs));
    } else if (msg.role === "assistant") {
      box.append(el("div", { class: "content", html: KilnMarkdown.render(msg.content) }));
    } else {
      box.append(el("div", { class: "content plain", text: msg.content }));
    }
    if (meta.tool_calls && meta.tool_calls.length) {
      const calls = meta.tool_calls.map((c) => `${c.function.name}(${c.function.arguments})`).join("\n");
      box.append(el("div", { class: "code" }, [el("span", { class: "code-lang", text: "tool calls" }),
        el("pre", { html: escapeHtml(calls) })]));
    }
    if (meta.error) box.append(el("div", { class: "error", text: meta.error }));
    if (msg.role === "assistant" && !opts.streaming) box.append(stats(meta));
    if (!opts.streaming && !opts.busy) {
      const actions = el("div", { class: "actions" });
      if (msg.role === "user") actions.append(el("button", { type: "button", class: "edit", text: "Edit", onclick: () => h.edit(i) }));
      if (msg.role === "assistant") {
        if (opts.last) actions.append(el("button", { type: "button", class: "regenerate", text: "Regenerate", onclick: () => h.regenerate(i) }));
        if (opts.last && meta.tool_calls && meta.tool_calls.length) {
          actions.append(el("button", { type: "button", class: "tool-result", text: "Tool results…", title: "Answer the tool calls and continue", onclick: () => h.toolResults(i) }));
        }
        actions.append(el("button", { type: "button", class: "provenance", text: "Provenance ⬇", title: "Download this message's provenance as JSON", onclick: () => h.provenance(i) }));
      }
      if (actions.childElementCount) box.append(actions);
    }
    return box;
  }

  return { el, message, probColour };
})();
