// Building DOM nodes without innerHTML: every text from the API (file names, error messages)
// lands in text nodes, never in markup.

/**
 * h("a", {href: "/x", class: "c", onclick: fn, dataset: {k: "v"}}, "text", childNode, [more])
 * Attributes with null/undefined/false values are left out; children may be nested arrays.
 */
export function h(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") {
      node.addEventListener(key.slice(2), value);
    } else if (key === "dataset") {
      Object.assign(node.dataset, value);
    } else if (key === "style" && typeof value === "object") {
      Object.assign(node.style, value);
    } else if (value === true) {
      node.setAttribute(key, "");
    } else {
      node.setAttribute(key, String(value));
    }
  }
  append(node, children);
  return node;
}

function append(node, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    if (Array.isArray(child)) append(node, child);
    else node.append(child instanceof Node ? child : String(child));
  }
}

/** Replace the content of `node` with `children`. */
export function fill(node, ...children) {
  node.replaceChildren();
  append(node, children);
  return node;
}

/**
 * A table: `columns` are {label, cell(row) -> node|text, class?, title?}; `rows` any values.
 * `rowAttrs(row)` gives each <tr> its attributes.
 */
export function table(columns, rows, { rowAttrs = () => ({}), empty = "nothing yet", attrs = {} } = {}) {
  const head = h("tr", {}, columns.map((c) => h("th", { class: c.class, title: c.title }, c.label)));
  const body = rows.length
    ? rows.map((row) =>
        h("tr", rowAttrs(row), columns.map((c) => h("td", { class: c.class }, c.cell(row)))))
    : [h("tr", { class: "empty" }, h("td", { colspan: columns.length }, empty))];
  return h("table", attrs, h("thead", {}, head), h("tbody", {}, body));
}

/** A labelled number card. */
export function stat(label, value, { title, id } = {}) {
  return h("div", { class: "stat", title, id }, h("div", { class: "stat-label" }, label),
    h("div", { class: "stat-value" }, value));
}

/** An error banner (for an ApiError or any Error). */
export function errorBox(error) {
  return h("div", { class: "error", role: "alert" }, error.message || String(error));
}

/** A status badge. */
export function badge(status) {
  return h("span", { class: `badge badge-${status}` }, status);
}

/** A progress bar for done/total (total 0: a full bar). */
export function progress(done, total) {
  const share = total > 0 ? Math.min(1, done / total) : 1;
  return h("div", { class: "progress", title: `${done} / ${total}` },
    h("div", { class: "progress-bar", style: { width: `${(share * 100).toFixed(1)}%` } }),
    h("span", { class: "progress-text" }, `${done} / ${total}`));
}
