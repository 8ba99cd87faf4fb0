// Small DOM helpers. Data reaches the page only through textContent and
// attributes, never as HTML; writes are skipped when nothing changed.

export function h(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

export function setText(e, t) {
  if (e.textContent !== t) e.textContent = t;
}

export function toggleClass(e, cls, on) {
  if (e.classList.contains(cls) !== on) e.classList.toggle(cls, on);
}
