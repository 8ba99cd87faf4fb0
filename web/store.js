// What the person chose (tab, sort, filter, chart range), kept in
// localStorage so a reload shows the page as they left it.

const STORE_KEY = 'yadcc-dashboard-v1';

export const ui = (function load() {
  let saved = null;
  try {
    saved = JSON.parse(localStorage.getItem(STORE_KEY) || 'null');
  } catch (e) {
    saved = null;
  }
  if (!saved || typeof saved !== 'object') saved = {};
  if (!saved.tables || typeof saved.tables !== 'object') saved.tables = {};
  return saved;
})();

let saveTimer = 0;
export function saveUi() {
  clearTimeout(saveTimer);
  saveTimer = setTimeout(() => {
    try {
      localStorage.setItem(STORE_KEY, JSON.stringify(ui));
    } catch (e) { /* private mode or quota: not important */ }
  }, 200);
}
