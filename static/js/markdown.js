// A small Markdown renderer for model output that builds DOM nodes directly: every piece of the
// model's text becomes a Text node (never innerHTML), so markup in the output — <script>, <img
// onerror=…>, entities — shows as the characters it is and cannot run. Links keep only http(s)
// and mailto URLs.
//
// Covers what chat models write: paragraphs with line breaks, # headings, - / * / 1. lists,
// > quotes, --- rules, ``` fenced code (an unclosed fence, as while streaming, runs to the end),
// `inline code`, **bold**, *italic* / _italic_, [links](https://…).
"use strict";

const SAFE_PROTOCOLS = new Set(["http:", "https:", "mailto:"]);

function el(tag, cls) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  return e;
}

/// The href to use for a link target, or null when it is not an allowed absolute URL.
export function safeHref(url) {
  try {
    const u = new URL(url);
    return SAFE_PROTOCOLS.has(u.protocol) ? u.href : null;
  } catch {
    return null;
  }
}

// Inline tokens, first match wins: code spans, bold, italic, links. Underscore emphasis only
// at word boundaries, as in CommonMark, so snake_case and __dunder__-like names stay text.
const INLINE = /(`+)([^`]|[^`][\s\S]*?[^`])\1(?!`)|\*\*(?=\S)([\s\S]*?\S)\*\*|(?<!\w)__(?=\S)([\s\S]*?\S)__(?!\w)|\*(?=[^\s*])([^*]*?[^\s*])\*|(?<![\w])_(?=[^\s_])([^_]*?[^\s_])_(?![\w])|\[([^\]\n]+)\]\(([^)\s]+)\)/;

/// Appends the inline content of `text` to `parent`.
export function renderInline(text, parent) {
  let rest = text;
  while (rest.length) {
    const m = INLINE.exec(rest);
    if (!m) {
      appendText(parent, rest);
      return;
    }
    if (m.index > 0) appendText(parent, rest.slice(0, m.index));
    if (m[1] !== undefined) {
      const code = el("code");
      code.textContent = m[2];
      parent.appendChild(code);
    } else if (m[3] !== undefined || m[4] !== undefined) {
      const b = el("strong");
      renderInline(m[3] ?? m[4], b);
      parent.appendChild(b);
    } else if (m[5] !== undefined || m[6] !== undefined) {
      const i = el("em");
      renderInline(m[5] ?? m[6], i);
      parent.appendChild(i);
    } else {
      const href = safeHref(m[8]);
      if (href) {
        const a = el("a");
        a.href = href;
        a.target = "_blank";
        a.rel = "noopener noreferrer nofollow";
        renderInline(m[7], a);
        parent.appendChild(a);
      } else {
        appendText(parent, m[0]); // not a safe link: show it as written
      }
    }
    rest = rest.slice(m.index + m[0].length);
  }
}

/// Text with its line breaks kept as <br>.
function appendText(parent, text) {
  const lines = text.split("\n");
  lines.forEach((line, i) => {
    if (i > 0) parent.appendChild(el("br"));
    if (line) parent.appendChild(document.createTextNode(line));
  });
}

const FENCE = /^\s{0,3}(```+|~~~+)\s*([\w+-]*)\s*$/;
const HEADING = /^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
const RULE = /^\s{0,3}([-*_])(\s*\1){2,}\s*$/;
const BULLET = /^\s{0,3}[-*+]\s+(.*)$/;
const ORDERED = /^\s{0,3}(\d{1,9})[.)]\s+(.*)$/;
const QUOTE = /^\s{0,3}>\s?(.*)$/;

/// Renders `text` into a new DocumentFragment.
export function renderMarkdown(text) {
  const out = document.createDocumentFragment();
  const lines = String(text).replace(/\r\n?/g, "\n").split("\n");
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    let m;
    if (!line.trim()) {
      i++;
    } else if ((m = FENCE.exec(line))) {
      // Closed by a run of the same character at least as long, alone on its line.
      const closing = new RegExp(`^\\s{0,3}\\${m[1][0]}{${m[1].length},}\\s*$`);
      const body = [];
      i++;
      while (i < lines.length && !closing.test(lines[i])) {
        body.push(lines[i]);
        i++;
      }
      i++; // the closing fence (or past the end while streaming)
      const pre = el("pre");
      const code = el("code");
      if (m[2]) code.dataset.lang = m[2];
      code.textContent = body.join("\n");
      pre.appendChild(code);
      out.appendChild(pre);
    } else if ((m = HEADING.exec(line))) {
      const h = el(`h${Math.min(6, m[1].length + 2)}`); // h3…h6: headings inside a reply stay small
      renderInline(m[2], h);
      out.appendChild(h);
      i++;
    } else if (RULE.test(line)) {
      out.appendChild(el("hr"));
      i++;
    } else if (BULLET.test(line) || ORDERED.test(line)) {
      const ordered = !BULLET.test(line);
      const re = ordered ? ORDERED : BULLET;
      const list = el(ordered ? "ol" : "ul");
      if (ordered) {
        const start = parseInt(ORDERED.exec(line)[1], 10);
        if (start !== 1) list.start = start;
      }
      while (i < lines.length && (m = re.exec(lines[i]))) {
        const li = el("li");
        let item = ordered ? m[2] : m[1];
        i++;
        // Indented continuation lines belong to the item.
        while (i < lines.length && /^\s{2,}\S/.test(lines[i]) && !BULLET.test(lines[i]) && !ORDERED.test(lines[i])) {
          item += "\n" + lines[i].trim();
          i++;
        }
        renderInline(item, li);
        list.appendChild(li);
      }
      out.appendChild(list);
    } else if (QUOTE.test(line)) {
      const quoted = [];
      while (i < lines.length && (m = QUOTE.exec(lines[i]))) {
        quoted.push(m[1]);
        i++;
      }
      const bq = el("blockquote");
      bq.appendChild(renderMarkdown(quoted.join("\n")));
      out.appendChild(bq);
    } else {
      const para = [];
      while (i < lines.length && lines[i].trim() && !startsBlock(lines[i])) {
        para.push(lines[i]);
        i++;
      }
      if (!para.length) {
        para.push(lines[i]);
        i++;
      }
      const p = el("p");
      renderInline(para.join("\n"), p);
      out.appendChild(p);
    }
  }
  return out;
}

function startsBlock(line) {
  return FENCE.test(line) || HEADING.test(line) || RULE.test(line) || BULLET.test(line) || ORDERED.test(line) || QUOTE.test(line);
}

/// Replaces `target`'s children with the rendering of `text`.
export function renderInto(target, text) {
  target.replaceChildren(renderMarkdown(text));
}
