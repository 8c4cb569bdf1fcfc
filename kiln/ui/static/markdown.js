// A small Markdown renderer for the page: fenced code, inline code, headings, lists, quotes,
// bold, italics, links and paragraphs. Safe by construction: every piece of the model's text is
// HTML-escaped before any tag of ours is put around it, and a link's target must be http(s).
"use strict";

const KilnMarkdown = (() => {
  const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
  const escapeHtml = (text) => String(text).replace(/[&<>"']/g, (c) => ESCAPES[c]);

  // inline spans of one line (already free of code fences)
  function inline(text) {
    const parts = String(text).split(/(`[^`\n]+`)/);
    return parts.map((part, i) => {
      if (i % 2 === 1) return `<code>${escapeHtml(part.slice(1, -1))}</code>`;
      let html = escapeHtml(part);
      html = html.replace(/\[([^\]\n]+)\]\((https?:\/\/[^\s)]+)\)/g,
        (_, label, url) => `<a href="${url}" target="_blank" rel="noopener noreferrer">${label}</a>`);
      html = html.replace(/\*\*([^*\n]+)\*\*/g, "<strong>$1</strong>");
      html = html.replace(/__([^_\n]+)__/g, "<strong>$1</strong>");
      html = html.replace(/(^|[^*\w])\*([^*\n]+)\*(?!\w)/g, "$1<em>$2</em>");
      html = html.replace(/(^|[^_\w])_([^_\n]+)_(?!\w)/g, "$1<em>$2</em>");
      return html;
    }).join("");
  }

  function codeBlock(lang, lines) {
    const cls = lang ? ` class="lang-${escapeHtml(lang)}"` : "";
    const label = lang ? `<span class="code-lang">${escapeHtml(lang)}</span>` : "";
    return `<div class="code">${label}<pre><code${cls}>${escapeHtml(lines.join("\n"))}</code></pre></div>`;
  }

  // Markdown text -> HTML. An unclosed fence (a stream still running) renders as code so far.
  function render(text) {
    const lines = String(text || "").split("\n");
    const out = [];
    let para = [];
    let list = null; // {tag, items}
    const flushPara = () => {
      if (para.length) out.push(`<p>${para.map(inline).join("<br>")}</p>`);
      para = [];
    };
    const flushList = () => {
      if (list) out.push(`<${list.tag}>${list.items.map((t) => `<li>${inline(t)}</li>`).join("")}</${list.tag}>`);
      list = null;
    };
    for (let i = 0; i < lines.length; i++) {
      const line = lines[i];
      const fence = line.match(/^\s*```\s*([\w+#.-]*)\s*$/);
      if (fence) {
        flushPara(); flushList();
        const body = [];
        i++;
        while (i < lines.length && !/^\s*```\s*$/.test(lines[i])) body.push(lines[i++]);
        out.push(codeBlock(fence[1], body));
        continue;
      }
      const heading = line.match(/^(#{1,6})\s+(.*)$/);
      const bullet = line.match(/^\s*[-*+]\s+(.*)$/);
      const numbered = line.match(/^\s*\d+[.)]\s+(.*)$/);
      const quote = line.match(/^>\s?(.*)$/);
      if (heading) {
        flushPara(); flushList();
        const level = Math.min(heading[1].length + 2, 6); // the page's own headings stay above
        out.push(`<h${level}>${inline(heading[2])}</h${level}>`);
      } else if (bullet || numbered) {
        flushPara();
        const tag = bullet ? "ul" : "ol";
        if (list && list.tag !== tag) flushList();
        if (!list) list = { tag, items: [] };
        list.items.push((bullet || numbered)[1]);
      } else if (quote) {
        flushPara(); flushList();
        out.push(`<blockquote>${inline(quote[1])}</blockquote>`);
      } else if (!line.trim()) {
        flushPara(); flushList();
      } else {
        flushList();
        para.push(line);
      }
    }
    flushPara(); flushList();
    return out.join("");
  }

  return { render, escapeHtml };
})();
