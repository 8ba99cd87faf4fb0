// The tab bar over the panels (arrow keys move between tabs, `#tab=name`
// in the address names one), and jumping to a panel with a filter set.

import { saveUi, ui } from '../store.js';

// `tables`: panel name -> Table. Returns `jumpTo(name, query)`.
export function setUpTabs(tables) {
  const tabs = Array.from(document.querySelectorAll('[role="tab"]'));
  function selectTab(name, focus) {
    for (const tab of tabs) {
      const on = tab.getAttribute('aria-controls') === name;
      tab.setAttribute('aria-selected', on ? 'true' : 'false');
      tab.tabIndex = on ? 0 : -1;
      document.getElementById(tab.getAttribute('aria-controls')).hidden = !on;
      if (on && focus) tab.focus();
    }
    if (tables[name]) tables[name].reveal();
    ui.tab = name;
    saveUi();
    if (location.hash !== '#tab=' + name && history.replaceState) history.replaceState(null, '', '#tab=' + name);
  }
  tabs.forEach((tab, i) => {
    tab.addEventListener('click', () => selectTab(tab.getAttribute('aria-controls'), false));
    tab.addEventListener('keydown', (ev) => {
      let j = -1;
      if (ev.key === 'ArrowRight') j = (i + 1) % tabs.length;
      else if (ev.key === 'ArrowLeft') j = (i - 1 + tabs.length) % tabs.length;
      else if (ev.key === 'Home') j = 0;
      else if (ev.key === 'End') j = tabs.length - 1;
      if (j >= 0) {
        ev.preventDefault();
        selectTab(tabs[j].getAttribute('aria-controls'), true);
      }
    });
  });
  const hashTab = /^#tab=(\w+)$/.exec(location.hash);
  selectTab(hashTab && tables[hashTab[1]] ? hashTab[1] : tables[ui.tab] ? ui.tab : 'servants', false);
  window.addEventListener('hashchange', () => {
    const m = /^#tab=(\w+)$/.exec(location.hash);
    if (m && tables[m[1]]) selectTab(m[1], false);
  });

  return function jumpTo(name, query) {
    const t = tables[name];
    if (!t) return;
    t.setQuery(query, 'all');
    selectTab(name, false);
    t.filterEl.focus({ preventScroll: true });
    const r = t.panel.closest('.tables').getBoundingClientRect();
    if (r.top < 0 || r.top > window.innerHeight * 0.6) t.panel.closest('.tables').scrollIntoView({ block: 'start' });
  };
}
