// markdown.js — a small Markdown → HTML renderer for model output (blazr's chat page).
//
// Safety first: every piece of text is HTML-escaped before any markup is added, so model output can
// never inject tags or attributes (`<script>`, `<img onerror>` show as text); link targets are kept
// only for http(s), mailto and in-page / relative URLs. Covers what chat answers use: headings,
// paragraphs, bold / italic / strikethrough, inline code, fenced code blocks (with a copy button; an
// unclosed fence — a stream still running — renders as code to the end), bullet and numbered lists,
// block quotes, horizontal rules and links.

const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };

export function escapeHtml(text) {
  return String(text).replace(/[&<>"']/g, (c) => ESCAPES[c]);
}

const SAFE_URL = /^(https?:\/\/|mailto:|#|\/(?!\/))/i;

// Inline markup of one block's text: escaped first, code spans set aside so nothing inside them is
// formatted, then links, bold, italic and strikethrough.
function inline(text) {
  const spans = [];
  let html = escapeHtml(text.replace(/\u0000/g, ""));
  html = html.replace(/(`+)([^`]|[^`][\s\S]*?[^`])\1(?!`)/g, (_, _ticks, code) => {
    spans.push(`<code>${code.trim() === "" ? code : code.replace(/^ (.*) $/, "$1")}</code>`);
    return `\u0000${spans.length - 1}\u0000`;
  });
  html = html.replace(/\[([^\]\n]+)\]\(([^)\s]+)\)/g, (whole, label, url) => {
    const raw = url.replace(/&amp;/g, "&");
    if (!SAFE_URL.test(raw)) return whole;
    return `<a href="${url}" target="_blank" rel="noopener noreferrer">${label}</a>`;
  });
  html = html
    .replace(/\*\*(?=\S)([\s\S]*?\S)\*\*/g, "<strong>$1</strong>")
    .replace(/(^|[^\w])__(?=\S)([\s\S]*?\S)__(?!\w)/g, "$1<strong>$2</strong>")
    .replace(/(^|[^*\w])\*([^\s*](?:[^*]*?[^\s*])?)\*(?!\*)/g, "$1<em>$2</em>")
    .replace(/(^|[^\w])_([^\s_](?:[^_]*?[^\s_])?)_(?!\w)/g, "$1<em>$2</em>")
    .replace(/~~(?=\S)([\s\S]*?\S)~~/g, "<del>$1</del>");
  return html.replace(/\u0000(\d+)\u0000/g, (_, i) => spans[Number(i)]);
}

function codeBlock(lang, lines) {
  const safeLang = (lang.match(/^[\w+#.-]+/) || [""])[0];
  const cls = safeLang ? ` class="language-${escapeHtml(safeLang)}"` : "";
  return (
    `<div class="code-block"><div class="code-head"><span class="code-lang">${escapeHtml(safeLang)}</span>` +
    `<button type="button" class="copy-code" aria-label="Copy code">Copy</button></div>` +
    `<pre><code${cls}>${escapeHtml(lines.join("\n"))}</code></pre></div>`
  );
}

const FENCE = /^\s{0,3}(```+|~~~+)\s*(.*)$/;
const HEADING = /^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
const RULE = /^\s{0,3}([-*_])(\s*\1){2,}\s*$/;
const BULLET = /^\s*[-*+]\s+(.*)$/;
const NUMBERED = /^\s*(\d{1,9})[.)]\s+(.*)$/;
const QUOTE = /^\s{0,3}>\s?(.*)$/;

function isBlockStart(line) {
  return FENCE.test(line) || HEADING.test(line) || RULE.test(line) || BULLET.test(line) ||
    NUMBERED.test(line) || QUOTE.test(line);
}

export function renderMarkdown(source) {
  const lines = String(source ?? "").replace(/\r\n?/g, "\n").split("\n");
  const out = [];
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    let m;
    if ((m = line.match(FENCE))) {
      const fence = m[1];
      const body = [];
      i++;
      while (i < lines.length && !lines[i].trim().startsWith(fence)) body.push(lines[i++]);
      i++; // the closing fence (or past the end: an unclosed fence ends with the text)
      out.push(codeBlock(m[2], body));
    } else if (line.trim() === "") {
      i++;
    } else if ((m = line.match(HEADING))) {
      const level = m[1].length;
      out.push(`<h${level}>${inline(m[2])}</h${level}>`);
      i++;
    } else if (RULE.test(line)) {
      out.push("<hr>");
      i++;
    } else if (BULLET.test(line) || NUMBERED.test(line)) {
      const ordered = !BULLET.test(line);
      const pattern = ordered ? NUMBERED : BULLET;
      const items = [];
      const start = ordered ? Number(line.match(NUMBERED)[1]) : 1;
      while (i < lines.length && (m = lines[i].match(pattern))) {
        let item = ordered ? m[2] : m[1];
        i++;
        // continuation lines: indented, not a new item or block
        while (i < lines.length && /^\s{2,}\S/.test(lines[i]) && !isBlockStart(lines[i])) {
          item += "\n" + lines[i++].trim();
        }
        items.push(`<li>${inline(item).replace(/\n/g, "<br>")}</li>`);
      }
      const tag = ordered ? "ol" : "ul";
      const startAttr = ordered && start !== 1 ? ` start="${start}"` : "";
      out.push(`<${tag}${startAttr}>${items.join("")}</${tag}>`);
    } else if (QUOTE.test(line)) {
      const body = [];
      while (i < lines.length && (m = lines[i].match(QUOTE))) {
        body.push(m[1]);
        i++;
      }
      out.push(`<blockquote>${renderMarkdown(body.join("\n"))}</blockquote>`);
    } else {
      const para = [];
      while (i < lines.length && lines[i].trim() !== "" && !isBlockStart(lines[i])) para.push(lines[i++]);
      out.push(`<p>${para.map(inline).join("<br>")}</p>`);
    }
  }
  return out.join("\n");
}
