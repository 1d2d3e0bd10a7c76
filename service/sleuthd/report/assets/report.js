// sleuthd report: renders the inline data (script#data) with no library and no network.
// The list shows one page of dialogues at a time and a dialogue is drawn only when opened, so a report of
// thousands of dialogues paints as fast as one of ten. Waveforms are decoded in the browser (Web Audio) from
// sidecar scripts next to the audio (a page opened from disk may not fetch files, but may load scripts).
(function () {
  'use strict';
  const DATA = JSON.parse(document.getElementById('data').textContent);
  const main = document.getElementById('main');
  const tip = document.getElementById('tip');
  const statusLine = document.getElementById('status');
  const PAGE = 50;

  // ------------------------------------------------------------------ formatting
  const ESC = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' };
  const esc = (s) => String(s == null ? '' : s).replace(/[&<>"']/g, (c) => ESC[c]);
  const fmt = (x, d = 3) => (x == null ? '–' : Number(x).toFixed(d));
  const words = (s) => String(s).replace(/_/g, ' ');
  // Known statuses get a palette class and a symbol; any other (e.g. "uncertain") a neutral look and its name.
  const LOOK = {
    inconsistent: ['bad', '✖'], consistent: ['good', '✓'], insufficient_audio: ['none', '–'],
    insufficient_context: ['none', '–'], unjudged: ['none', '–'], error: ['err', '!'],
  };
  const look = (s) => LOOK[s] || ['other', '?'];
  const badge = (s, text) =>
    `<span class="badge ${look(s)[0]}" data-status="${esc(s)}"><span aria-hidden="true">${look(s)[1]}</span> ${esc(text || words(s))}</span>`;
  const SCALE = { probability: 'P', cosine_similarity: 'cos', cosine_distance: 'cos dist' };
  const KNOWN_OUTCOMES = ['inconsistent', 'unjudged', 'consistent', 'error'];
  const severity = (o) => ({ error: 0, inconsistent: 1, unjudged: 8, consistent: 9 })[o] ?? 5;
  const bar = (p, cls = '') =>
    p == null ? '' : `<span class="bar ${cls}" aria-hidden="true"><i style="width:${(100 * Math.max(0, Math.min(1, p))).toFixed(1)}%"></i></span>`;
  function say(text) { statusLine.textContent = text; }

  // ------------------------------------------------------------------ audio: playing one clip, or a sequence
  let chain = 0;
  function stopAll() {
    chain += 1;
    for (const a of document.querySelectorAll('audio')) { a.pause(); a.closest('tr, li')?.classList.remove('playing'); }
  }
  function playSeq(items) { // items: [[audio element, label], ...], one after another
    stopAll();
    const token = chain;
    let k = 0;
    const next = () => {
      if (token !== chain || k >= items.length) { if (token === chain) say(''); return; }
      const [a, what] = items[k++];
      document.querySelectorAll('.playing').forEach((e) => e.classList.remove('playing'));
      a.closest('tr, li')?.classList.add('playing');
      say(`Playing ${what}` + (k < items.length ? `, then ${items[k][1]}` : ''));
      a.currentTime = 0;
      a.addEventListener('ended', next, { once: true });
      a.play().catch(() => say(`Cannot play ${what}: the browser refused (press a play button once)`));
    };
    next();
  }
  function toggle(a, what) {
    if (!a) { say(`${what}: no audio`); return; }
    if (a.paused) playSeq([[a, what]]); else { stopAll(); say(''); }
  }

  // ------------------------------------------------------------------ waveforms (Web Audio) with drift segments
  const decoded = {};
  function loadScriptBytes(url, js) {
    return new Promise((resolve, reject) => {
      const store = () => (window.SLEUTHD_AUDIO || {})[url];
      if (store()) { resolve(store()); return; }
      const s = document.createElement('script');
      s.src = js;
      s.onload = () => (store() ? resolve(store()) : reject(new Error(`${js} holds no audio`)));
      s.onerror = () => reject(new Error(`cannot load ${js}`));
      document.head.appendChild(s);
    });
  }
  function decode(url, js) {
    if (!decoded[url]) {
      decoded[url] = loadScriptBytes(url, js).then((b64) => {
        const bin = atob(b64);
        const bytes = new Uint8Array(bin.length);
        for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
        delete window.SLEUTHD_AUDIO[url]; // keep the decoded samples only
        return new OfflineAudioContext(1, 1, 44100).decodeAudioData(bytes.buffer);
      });
    }
    return decoded[url];
  }
  function drawWave(canvas, buf, segs, cursor) {
    const dpr = window.devicePixelRatio || 1;
    const w = canvas.clientWidth || 600, h = canvas.clientHeight || 72;
    canvas.width = Math.round(w * dpr); canvas.height = Math.round(h * dpr);
    const g = canvas.getContext('2d');
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, w, h);
    const dur = buf.duration, x = (t) => (t / dur) * w;
    for (const [s, e, score] of segs) { // drift: orange band, hatched, with its score
      g.fillStyle = 'rgba(230,159,0,0.35)';
      g.fillRect(x(s), 0, Math.max(2, x(e) - x(s)), h);
      g.strokeStyle = 'rgba(150,95,0,0.6)'; g.lineWidth = 1;
      for (let k = x(s) - h; k < x(e); k += 6) { g.beginPath(); g.moveTo(Math.max(k, x(s)), Math.min(h, h - (Math.max(k, x(s)) - k))); g.lineTo(Math.min(k + h, x(e)), Math.max(0, h - (Math.min(k + h, x(e)) - k))); g.stroke(); }
      g.fillStyle = '#6b4800'; g.font = '11px system-ui, sans-serif';
      g.fillText(`drift ${fmt(score, 2)}`, x(s) + 3, 12);
    }
    const data = buf.getChannelData(0), step = Math.max(1, Math.floor(data.length / w));
    g.fillStyle = '#0072b2';
    for (let px = 0; px < w; px++) {
      let lo = 1, hi = -1;
      const a = px * step, b = Math.min(data.length, a + step);
      for (let i = a; i < b; i++) { const v = data[i]; if (v < lo) lo = v; if (v > hi) hi = v; }
      if (hi < lo) continue;
      g.fillRect(px, (1 - hi) * h / 2, 1, Math.max(1, (hi - lo) * h / 2));
    }
    if (cursor != null && cursor > 0) { g.fillStyle = '#009e73'; g.fillRect(x(cursor), 0, 2, h); }
  }
  function waveforms(d) {
    for (const canvas of main.querySelectorAll('canvas.wave')) {
      const t = d.t[+canvas.dataset.k];
      decode(t.a, t.w).then((buf) => {
        const audio = document.getElementById(`audio-${canvas.dataset.k}`);
        const redraw = () => drawWave(canvas, buf, t.seg, audio ? audio.currentTime : null);
        redraw();
        canvas.dataset.state = 'drawn';
        canvas.dataset.duration = buf.duration.toFixed(3);
        canvas.dataset.segments = String(t.seg.length);
        audio?.addEventListener('timeupdate', redraw);
        canvas.addEventListener('click', (ev) => { // seek to where the waveform was clicked, and play
          if (!audio) return;
          const r = canvas.getBoundingClientRect();
          audio.currentTime = ((ev.clientX - r.left) / r.width) * buf.duration;
          audio.play().catch(() => {});
        });
      }).catch((err) => { canvas.dataset.state = 'failed'; canvas.title = String(err); });
    }
  }

  // ------------------------------------------------------------------ the turn x turn heat map
  const CIVIDIS = [[0, 32, 77], [65, 77, 107], [124, 123, 120], [188, 175, 111], [255, 234, 70]];
  function colour(u) {
    const x = Math.max(0, Math.min(1, u)) * (CIVIDIS.length - 1), i = Math.min(CIVIDIS.length - 2, Math.floor(x)), f = x - i;
    const c = CIVIDIS[i].map((v, j) => Math.round(v + f * (CIVIDIS[i + 1][j] - v)));
    return `rgb(${c[0]},${c[1]},${c[2]})`;
  }
  function heatmap(d) {
    const box = main.querySelector('#heat');
    if (!d.sim) {
      box.innerHTML = '<p class="muted">Not in this verdict: check with <code>--report</code> (or <code>similarity_matrix=True</code>) to get the turn × turn cosines.</p>';
      return;
    }
    const n = d.sim.ids.length, at = {};
    d.sim.ids.forEach((id, i) => { at[id] = i; });
    const byId = {};
    d.t.forEach((t) => { byId[t.id] = t; });
    // Speakers grouped, in order of first appearance; each group's turns in dialogue order.
    const order = [], groups = [];
    for (const s of d.sp) {
      const ids = d.sim.ids.filter((id) => byId[id] && byId[id].s === s.n);
      if (ids.length) { groups.push([s.n, order.length, ids.length]); order.push(...ids); }
    }
    const cos = (a, b) => d.sim.c[at[a] * n + at[b]];
    let lo = 1, hi = -1;
    for (let i = 0; i < n; i++) for (let j = 0; j < n; j++) if (i !== j) { const v = d.sim.c[i * n + j]; lo = Math.min(lo, v); hi = Math.max(hi, v); }
    if (!(hi > lo)) { lo = Math.min(lo, hi) - 0.01; hi = lo + 0.02; }
    const cell = Math.max(4, Math.min(44, Math.floor(520 / Math.max(1, n)))), ids = cell >= 12, pad = ids ? 96 : 70;
    const side = pad + cell * n + 4;
    const dpr = window.devicePixelRatio || 1;
    const canvas = document.createElement('canvas');
    canvas.className = 'heat';
    canvas.width = side * dpr; canvas.height = side * dpr;
    canvas.style.width = side + 'px'; canvas.style.height = side + 'px';
    const g = canvas.getContext('2d');
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.font = '11px system-ui, sans-serif';
    order.forEach((a, i) => order.forEach((b, j) => {
      g.fillStyle = i === j ? '#d9d9d9' : colour((cos(a, b) - lo) / (hi - lo));
      g.fillRect(pad + j * cell, pad + i * cell, cell, cell);
    }));
    g.strokeStyle = '#fff'; g.lineWidth = 2; g.fillStyle = '#1b1b1b';
    const short = (text, room) => { let t = text; while (t.length > 1 && g.measureText(t).width > room) t = t.slice(0, -2) + '…'; return t; };
    for (const [name, start, len] of groups) { // group borders, speaker names (left and top), turn ids
      const p = pad + start * cell, mid = p + (cell * len) / 2;
      g.strokeRect(pad, p, cell * n, cell * len); g.strokeRect(p, pad, cell * len, cell * n);
      g.font = 'bold 12px system-ui, sans-serif'; g.fillStyle = '#1b1b1b';
      g.textAlign = 'left'; g.fillText(short(name, ids ? pad - 44 : pad - 8), 2, mid + 4);
      g.textAlign = 'center'; g.fillText(short(name, Math.max(cell * len - 4, 30)), mid, 13);
    }
    g.font = '11px system-ui, sans-serif'; g.fillStyle = '#1b1b1b';
    if (ids) order.forEach((id, i) => {
      const c = pad + i * cell + cell / 2;
      g.textAlign = 'right'; g.fillText(short(id, 36), pad - 6, c + 4);
      g.save(); g.translate(c + 4, pad - 6); g.rotate(-Math.PI / 2); g.textAlign = 'left'; g.fillText(short(id, pad - 30), 0, 0); g.restore();
    });
    order.forEach((id, i) => { // flagged turns: a vermillion mark on both axes
      const t = byId[id];
      if (t && t.st === 'inconsistent') {
        g.fillStyle = '#d55e00';
        g.fillRect(pad - 3, pad + i * cell, 3, cell); g.fillRect(pad + i * cell, pad - 3, cell, 3);
      }
    });
    canvas.addEventListener('mousemove', (ev) => {
      const r = canvas.getBoundingClientRect();
      const j = Math.floor((ev.clientX - r.left - pad) / cell), i = Math.floor((ev.clientY - r.top - pad) / cell);
      if (i < 0 || j < 0 || i >= n || j >= n) { tip.hidden = true; return; }
      const a = byId[order[i]], b = byId[order[j]];
      tip.textContent = `${order[i]} (${a ? a.s : ''}) × ${order[j]} (${b ? b.s : ''}): cosine ${fmt(cos(order[i], order[j]))}`;
      tip.style.left = ev.clientX + 12 + 'px'; tip.style.top = ev.clientY + 12 + 'px'; tip.hidden = false;
    });
    canvas.addEventListener('mouseleave', () => { tip.hidden = true; });
    canvas.addEventListener('click', (ev) => {
      const r = canvas.getBoundingClientRect(), i = Math.floor((ev.clientY - r.top - pad) / cell);
      if (i >= 0 && i < n) selectTurn(d.t.findIndex((t) => t.id === order[i]), true);
    });
    // The same numbers as text: mean cosine within each speaker and across speakers.
    const within = [], across = [];
    for (const [name, start, len] of groups) {
      let s = 0, c = 0;
      for (let i = start; i < start + len; i++) for (let j = start; j < start + len; j++) if (i !== j) { s += cos(order[i], order[j]); c++; }
      within.push(`${esc(name)} ${c ? fmt(s / c) : '–'}`);
    }
    let s = 0, c = 0;
    order.forEach((a, i) => order.forEach((b, j) => {
      const ga = groups.findIndex(([, st, len]) => i >= st && i < st + len), gb = groups.findIndex(([, st, len]) => j >= st && j < st + len);
      if (ga !== gb) { s += cos(a, b); c++; }
    }));
    if (c) across.push(fmt(s / c));
    canvas.setAttribute('role', 'img');
    canvas.setAttribute('aria-label', `Cosine similarity of ${n} turns, grouped by speaker`);
    canvas.dataset.turns = String(n);
    box.innerHTML = '';
    const legend = document.createElement('div');
    legend.className = 'legend';
    legend.innerHTML = `<canvas width="192" height="12" aria-hidden="true"></canvas><div><span>${fmt(lo)}</span><span>cosine similarity</span><span>${fmt(hi)}</span></div>` +
      `<p><small>Mean cosine within a speaker: ${within.join(', ')}${across.length ? `; across speakers: ${across[0]}` : ''}.<br>` +
      'Grey diagonal: a turn with itself. Orange marks: flagged turns. Click a row to select its turn.</small></p>';
    const lg = legend.querySelector('canvas').getContext('2d');
    for (let x = 0; x < 192; x++) { lg.fillStyle = colour(x / 191); lg.fillRect(x, 0, 1, 12); }
    const wrap = document.createElement('div');
    wrap.className = 'heat-wrap';
    wrap.append(canvas, legend);
    box.append(wrap);
  }

  // ------------------------------------------------------------------ the list of dialogues
  const dialogues = DATA.dialogues || [];
  const st = { outcome: 'all', speaker: '', pmin: 0, q: '', sort: 'severity', dir: 1, page: 0, sel: 0 };
  let view = [];
  const SORTS = {
    id: (d) => d.id, severity: (d) => severity(d.o), speakers: (d) => d.sp.length, turns: (d) => d.t.length,
    nf: (d) => -d.nf, pmax: (d) => -(d.pmax ?? -1),
  };
  function filter() {
    const sp = st.speaker.toLowerCase(), q = st.q.toLowerCase();
    view = dialogues.filter((d) =>
      (st.outcome === 'all' || d.o === st.outcome) &&
      (!sp || d.sp.some((s) => s.n.toLowerCase().includes(sp))) &&
      (!(st.pmin > 0) || (d.pmax != null && d.pmax >= st.pmin)) &&
      (!q || d.id.toLowerCase().includes(q) || d.src.toLowerCase().includes(q))).map((d) => d.i);
    const key = SORTS[st.sort];
    view.sort((a, b) => {
      const x = key(dialogues[a]), y = key(dialogues[b]);
      return (x < y ? -1 : x > y ? 1 : 0) * st.dir || a - b;
    });
  }
  function counts() {
    const by = {};
    for (const d of dialogues) by[d.o] = (by[d.o] || 0) + 1;
    const cards = [['all', 'checked', dialogues.length - (by.error || 0), 'good'], ['inconsistent', 'inconsistent', by.inconsistent || 0, 'bad']];
    for (const o of Object.keys(by).sort()) if (!KNOWN_OUTCOMES.includes(o)) cards.push([o, words(o), by[o], 'other']);
    cards.push(['unjudged', 'unjudged', by.unjudged || 0, 'none'], ['consistent', 'consistent', by.consistent || 0, 'good']);
    if (by.error) cards.push(['error', 'failed', by.error, 'err']);
    return cards;
  }
  function renderList(focus) {
    filter();
    const pages = Math.max(1, Math.ceil(view.length / PAGE));
    st.page = Math.min(st.page, pages - 1);
    st.sel = Math.max(0, Math.min(st.sel, view.length - 1));
    const first = st.page * PAGE, rows = view.slice(first, first + PAGE);
    const speakers = new Set();
    for (const d of dialogues) for (const s of d.sp) { speakers.add(s.n); if (speakers.size > 500) break; }
    const outcomes = ['all', ...new Set(dialogues.map((d) => d.o))];
    const head = (key, text, cls = '') => {
      const sort = st.sort === key ? (st.dir > 0 ? 'ascending' : 'descending') : 'none';
      return `<th class="${cls}" aria-sort="${sort}"><button type="button" data-sort="${key}">${text}</button></th>`;
    };
    main.innerHTML =
      `<section class="cards" aria-label="Summary">${counts().map(([key, text, n, cls]) =>
        `<button type="button" class="card ${cls}" data-outcome="${esc(key)}" aria-pressed="${st.outcome === key}"><b>${n}</b>${esc(text)}</button>`).join('')}</section>` +
      `<form class="filters" role="search" onsubmit="return false">` +
      `<label>Status<select id="f-outcome">${outcomes.map((o) => `<option value="${esc(o)}"${o === st.outcome ? ' selected' : ''}>${esc(o === 'all' ? 'all' : words(o))}</option>`).join('')}</select></label>` +
      `<label>Speaker<input id="f-speaker" list="speakers" value="${esc(st.speaker)}" placeholder="any"></label>` +
      `<datalist id="speakers">${[...speakers].map((s) => `<option value="${esc(s)}">`).join('')}</datalist>` +
      `<label>Highest P(not speaker) ≥<input id="f-pmin" type="number" min="0" max="1" step="0.05" value="${st.pmin || ''}" placeholder="0"></label>` +
      `<label>Dialogue id<input id="f-q" type="search" value="${esc(st.q)}" placeholder="search (/)"></label></form>` +
      `<p class="count" elementtiming="sleuthd-list">${view.length ? `Dialogues ${first + 1}–${first + rows.length} of ${view.length}` : 'No dialogue matches'}` +
      `${view.length !== dialogues.length ? ` (filtered from ${dialogues.length})` : ''}</p>` +
      `<div class="scroll"><table class="list stack"><thead><tr>${head('id', 'Dialogue')}${head('severity', 'Verdict')}${head('speakers', 'Speakers')}` +
      `${head('turns', 'Turns', 'num')}${head('nf', 'Flagged turns')}${head('pmax', 'Highest P(not speaker)', 'num')}</tr></thead><tbody>` +
      rows.map((i, k) => {
        const d = dialogues[i];
        const sel = first + k === st.sel ? ' sel' : '';
        const flagged = new Set(d.sp.flatMap((s) => s.f));
        return `<tr class="row o-${look(d.o)[0]}${sel}" tabindex="-1" data-i="${i}" data-pos="${first + k}">` +
          `<td data-label="Dialogue"><a href="#d=${i}">${esc(d.id)}</a>${d.src ? `<br><small>${esc(d.src)}</small>` : ''}</td>` +
          `<td data-label="Verdict">${badge(d.o)}${d.err ? `<br><small>${esc(d.err)}</small>` : ''}</td>` +
          `<td data-label="Speakers">${d.sp.map((s) => (s.f.length ? `<span class="flag-ids">✖ ${esc(s.n)}</span>` : esc(s.n) + (s.j ? '' : ' <small>(unjudged)</small>'))).join(', ')}</td>` +
          `<td class="num" data-label="Turns">${d.t.length}</td>` +
          `<td data-label="Flagged"><span class="flag-ids">${esc([...flagged].join(', '))}</span></td>` +
          `<td class="num" data-label="Highest P">${fmt(d.pmax)}${bar(d.pmax)}</td></tr>`;
      }).join('') + `</tbody></table></div>` +
      `<nav class="pager" aria-label="Pages"><button type="button" data-page="-1"${st.page ? '' : ' disabled'}>‹ Previous <kbd>[</kbd></button>` +
      `<span>Page ${st.page + 1} of ${pages}</span><button type="button" data-page="1"${st.page < pages - 1 ? '' : ' disabled'}>Next <kbd>]</kbd> ›</button></nav>`;
    main.querySelectorAll('[data-outcome]').forEach((b) => b.addEventListener('click', () => {
      st.outcome = st.outcome === b.dataset.outcome ? 'all' : b.dataset.outcome; st.page = 0; st.sel = 0; renderList();
    }));
    main.querySelectorAll('[data-sort]').forEach((b) => b.addEventListener('click', () => {
      const key = b.dataset.sort;
      st.dir = st.sort === key ? -st.dir : 1; st.sort = key; renderList();
    }));
    main.querySelectorAll('[data-page]').forEach((b) => b.addEventListener('click', () => page(+b.dataset.page)));
    main.querySelectorAll('tr.row').forEach((r) => r.addEventListener('click', (ev) => {
      if (ev.target.closest('a')) return;
      location.hash = `d=${r.dataset.i}`;
    }));
    const bind = (id, key, parse) => {
      const el = document.getElementById(id);
      el.addEventListener(el.tagName === 'SELECT' ? 'change' : 'input', () => {
        st[key] = parse(el.value); st.page = 0; st.sel = 0;
        renderList(); const again = document.getElementById(id); again.focus();
        if (again.setSelectionRange && again.type !== 'number') again.setSelectionRange(again.value.length, again.value.length);
      });
    };
    bind('f-outcome', 'outcome', String); bind('f-speaker', 'speaker', String); bind('f-q', 'q', String);
    bind('f-pmin', 'pmin', (v) => parseFloat(v) || 0);
    if (focus) main.querySelector('tr.row.sel')?.focus();
  }
  function page(step) {
    const pages = Math.max(1, Math.ceil(view.length / PAGE));
    const p = Math.max(0, Math.min(pages - 1, st.page + step));
    if (p !== st.page) { st.page = p; st.sel = p * PAGE; renderList(true); }
  }
  function moveSel(step) {
    if (!view.length) return;
    st.sel = Math.max(0, Math.min(view.length - 1, st.sel + step));
    const p = Math.floor(st.sel / PAGE);
    if (p !== st.page) { st.page = p; renderList(true); return; }
    main.querySelectorAll('tr.row').forEach((r) => r.classList.toggle('sel', +r.dataset.pos === st.sel));
    const row = main.querySelector('tr.row.sel');
    row?.focus(); row?.scrollIntoView({ block: 'nearest' });
  }

  // ------------------------------------------------------------------ one dialogue
  let current = null, turnSel = 0;
  function refFor(d, k) { // what "a" plays after turn k: the reference, else the speaker's most typical other turn
    const t = d.t[k], si = d.sp.findIndex((s) => s.n === t.s);
    const ref = document.getElementById(`ref-${si}`);
    if (ref) return [ref, `${t.s}'s reference`];
    let best = -1;
    d.t.forEach((u, j) => {
      if (j !== k && u.s === t.s && u.a && u.st === 'consistent' && (best < 0 || (u.pw ?? -2) > (d.t[best].pw ?? -2))) best = j;
    });
    return best < 0 ? null : [document.getElementById(`audio-${best}`), `${d.t[best].id} (${t.s}'s most typical turn)`];
  }
  function encoders(t) {
    const rows = t.e.length ? t.e : [['', t.pw, t.cd, t.rc]];
    return rows.map(([name, pw, cd, rc]) =>
      `<div class="enc">${name ? `<b>${esc(name)}</b> ` : ''}pair ${fmt(pw)} · cent ${fmt(cd)} · ref ${fmt(rc)}</div>`).join('');
  }
  function renderDialogue(i) {
    const d = dialogues[i];
    current = d;
    stopAll();
    const pos = view.indexOf(i);
    const flaggedAt = d.t.findIndex((t) => t.st === 'inconsistent');
    turnSel = flaggedAt >= 0 ? flaggedAt : 0;
    const nav = (delta, text, key) => {
      const j = pos < 0 ? -1 : view[pos + delta];
      return `<button type="button" data-go="${j ?? ''}"${j == null || j < 0 ? ' disabled' : ''}>${text} <kbd>${key}</kbd></button>`;
    };
    const meta = [d.src && esc(d.src), d.enc && `encoder <b>${esc(d.enc)}</b>`, d.m && `method <b>${esc(d.m)}</b>`,
      d.ts && `thresholds ${esc(d.ts)}`, d.drift && 'drift searched'].filter(Boolean).join(' · ');
    main.innerHTML =
      `<nav class="crumbs" aria-label="Dialogues"><button type="button" data-back>← All dialogues <kbd>Esc</kbd></button>` +
      `${nav(-1, '‹ Previous', 'b')}${nav(1, 'Next ›', 'n')}<span class="muted">${pos >= 0 ? `${pos + 1} of ${view.length}` : ''}</span></nav>` +
      `<section class="dhead"><h2 tabindex="-1" id="dtitle">${esc(d.id)} ${badge(d.o)}</h2><p class="muted">${meta}</p>` +
      `${d.err ? `<p class="error">Check failed: ${esc(d.err)}</p>` : ''}</section>` +
      (d.t.length ? `<h3>Speakers</h3><div class="scroll"><table class="speakers stack"><thead><tr><th>Speaker</th><th>Verdict</th><th class="num">Scored</th><th class="num">Unscored</th><th>Flagged turns</th><th>Reference</th></tr></thead><tbody>` +
        d.sp.map((s, si) => `<tr data-speaker="${esc(s.n)}"><td data-label="Speaker"><b>${esc(s.n)}</b></td>` +
          `<td data-label="Verdict">${s.j ? (s.c ? badge('consistent') : badge('inconsistent')) : badge('unjudged')}</td>` +
          `<td class="num" data-label="Scored">${s.scored}</td><td class="num" data-label="Unscored">${s.unscored}</td>` +
          `<td data-label="Flagged"><span class="flag-ids">${esc(s.f.join(', ')) || '–'}</span></td>` +
          `<td data-label="Reference">${s.ref ? `<audio id="ref-${si}" controls preload="metadata" src="${esc(s.ref)}" title="${esc(s.refn)}" aria-label="reference of ${esc(s.n)}"></audio>` : s.voice ? `registered voice <code>${esc(s.voice)}</code>` : '<span class="muted">none</span>'}</td></tr>`).join('') +
        `</tbody></table></div>` +
        `<h3>Turns</h3><div class="scroll"><table class="turns stack"><thead><tr><th>Turn</th><th>Audio</th><th>Speaker</th><th>Status</th>` +
        `<th class="num">P(not speaker)</th><th class="num">Score</th><th>Closest other speaker (margin)</th><th class="num">Speech s</th>` +
        `<th>Encoders <small>(pairwise · centroid · reference)</small></th></tr></thead><tbody>` +
        d.t.map((t, k) => {
          const cls = t.st === 'inconsistent' ? ' flagged' : look(t.st)[0] === 'other' ? ' st-other' : '';
          const own = t.cl && t.cl === t.s, margin = t.mg == null ? '' : ` (${t.mg >= 0 ? '+' : ''}${fmt(t.mg)})`;
          const closest = t.cl ? (own ? `${esc(t.cl)}${margin} <small>own speaker</small>` : `<span class="closer">${esc(t.cl)}${margin}</span>`) : '–';
          const cmp = t.th == null ? '' : `<br><small title="${esc(words(t.scale))}">${esc(SCALE[t.scale] || words(t.scale))}, thr ${fmt(t.th)}</small>`;
          const row = `<tr id="turn-${k}" class="turn${cls}" tabindex="-1" data-k="${k}" data-turn="${esc(t.id)}" data-status="${esc(t.st)}">` +
            `<td class="text" data-label="Turn"><b>${esc(t.id)}</b>${t.tx ? `<small>“${esc(t.tx)}”</small>` : ''}</td>` +
            `<td data-label="Audio">${t.a ? `<audio id="audio-${k}" controls preload="metadata" src="${esc(t.a)}" title="${esc(t.an)}" aria-label="turn ${esc(t.id)}"></audio>` : '<span class="muted">no audio</span>'}</td>` +
            `<td data-label="Speaker">${esc(t.s)}</td>` +
            `<td data-label="Status">${badge(t.st)}${t.r ? `<br><small>${esc(words(t.r))}</small>` : ''}${t.d ? `<br><small>${esc(t.d)}</small>` : ''}</td>` +
            `<td class="num" data-label="P(not speaker)">${fmt(t.p)}${bar(t.p)}</td>` +
            `<td class="num" data-label="Score">${fmt(t.sc)}${cmp}</td>` +
            `<td data-label="Closest other">${closest}</td>` +
            `<td class="num" data-label="Speech s">${fmt(t.sp, 2)}<br><small>of ${fmt(t.au, 2)}</small></td>` +
            `<td data-label="Encoders">${encoders(t)}</td></tr>`;
          const wave = t.w ? `<tr class="wave-row${cls}" data-k="${k}"><td colspan="9"><canvas class="wave" data-k="${k}" role="img" aria-label="waveform of ${esc(t.id)}${t.seg.length ? ` with ${t.seg.length} drift segment(s)` : ''}"></canvas>` +
            `<small>Drift score ${fmt(t.dr)} (cosine distance)${t.seg.length ? ': ' + t.seg.map(([s, e, sc]) => `${fmt(s, 2)}–${fmt(e, 2)} s (${fmt(sc)})`).join(', ') : ': no voice change found'}. Click the waveform to play from there.</small></td></tr>` : '';
          return row + wave;
        }).join('') + `</tbody></table></div>` +
        `<h3>Turn × turn similarity</h3><div id="heat"></div>` : '');
    main.querySelector('[data-back]').addEventListener('click', () => { location.hash = ''; });
    main.querySelectorAll('[data-go]').forEach((b) => b.addEventListener('click', () => { if (b.dataset.go) location.hash = `d=${b.dataset.go}`; }));
    main.querySelectorAll('tr.turn').forEach((r) => r.addEventListener('click', (ev) => { if (!ev.target.closest('audio')) selectTurn(+r.dataset.k, false); }));
    if (d.t.length) { heatmap(d); waveforms(d); selectTurn(turnSel, false); }
    document.getElementById('dtitle').focus();
    document.title = `${d.id} · ${DATA.title}`;
  }
  function selectTurn(k, focus) {
    if (!current || k < 0 || k >= current.t.length) return;
    turnSel = k;
    main.querySelectorAll('tr.turn').forEach((r) => r.classList.toggle('sel', +r.dataset.k === k));
    const row = document.getElementById(`turn-${k}`);
    if (focus) { row.focus(); row.scrollIntoView({ block: 'nearest' }); }
  }
  function go(delta) {
    const pos = view.indexOf(current.i), j = view[pos + delta];
    if (pos >= 0 && j != null) { st.sel = pos + delta; st.page = Math.floor(st.sel / PAGE); location.hash = `d=${j}`; }
  }

  // ------------------------------------------------------------------ a ranking (sleuthd rank --report)
  let rankSel = 0;
  function renderRanking() {
    const r = DATA.ranking;
    const better = r.cands.length && r.cands[0].hib ? 'higher is better' : 'lower is better';
    main.innerHTML =
      `<section class="dhead"><h2 tabindex="-1" id="dtitle">Candidates for ${esc(r.speaker || 'the speaker')}</h2>` +
      `<p class="muted">encoder <b>${esc(r.enc)}</b> · method <b>${esc(r.m)}</b> · ${r.usable} usable context clip(s), best first</p></section>` +
      `<div class="scroll"><table class="ranking stack"><thead><tr><th class="num">Rank</th><th>Candidate</th><th class="num">Fit probability</th>` +
      `<th class="num">Score</th><th class="num">Speech s</th><th>Audio</th></tr></thead><tbody>` +
      r.cands.map((c, k) => `<tr id="cand-${k}" class="turn${k === 0 ? ' best' : ''}" tabindex="-1" data-k="${k}" data-candidate="${esc(c.id)}">` +
        `<td class="num" data-label="Rank"><b>${c.rank}</b>${k === 0 ? ' <span class="badge good">best</span>' : ''}</td><td data-label="Candidate">${esc(c.id)}</td>` +
        `<td class="num" data-label="Fit probability">${fmt(c.fit)}${bar(c.fit, 'fit')}</td>` +
        `<td class="num" data-label="Score">${fmt(c.sc)}<br><small>${esc(words(c.scale))}, ${better}</small></td>` +
        `<td class="num" data-label="Speech s">${fmt(c.sp, 2)}</td>` +
        `<td data-label="Audio"><audio id="audio-${k}" controls preload="metadata" src="${esc(c.a)}" title="${esc(c.an)}" aria-label="candidate ${esc(c.id)}"></audio></td></tr>`).join('') +
      `</tbody></table></div><h3>The speaker</h3><ul class="clips">` +
      (r.ref ? `<li>Reference: <audio id="ref-0" controls preload="metadata" src="${esc(r.ref.a)}" title="${esc(r.ref.an)}" aria-label="reference"></audio></li>` : '') +
      (r.voice ? `<li>Registered voice <code>${esc(r.voice)}</code></li>` : '') +
      r.ctx.map((c, k) => `<li>Context ${k + 1}: <audio id="ctx-${k}" controls preload="metadata" src="${esc(c.a)}" title="${esc(c.an)}" aria-label="context clip ${k + 1}"></audio> <small>${esc(c.an)}</small></li>`).join('') + '</ul>';
    main.querySelectorAll('tr.turn').forEach((row) => row.addEventListener('click', (ev) => { if (!ev.target.closest('audio')) selectCand(+row.dataset.k); }));
    selectCand(0);
    document.getElementById('dtitle').focus();
  }
  function selectCand(k) {
    const n = DATA.ranking.cands.length;
    rankSel = Math.max(0, Math.min(n - 1, k));
    main.querySelectorAll('tr.turn').forEach((r) => r.classList.toggle('sel', +r.dataset.k === rankSel));
    const row = document.getElementById(`cand-${rankSel}`); row?.focus(); row?.scrollIntoView({ block: 'nearest' });
  }

  // ------------------------------------------------------------------ routing and keys
  function route() {
    tip.hidden = true;
    if (DATA.kind === 'rank') { renderRanking(); return; }
    const m = /^#d=(\d+)$/.exec(location.hash);
    if (m && dialogues[+m[1]]) renderDialogue(+m[1]);
    else { current = null; document.title = DATA.title; renderList(true); }
  }
  document.addEventListener('keydown', (e) => {
    if (e.ctrlKey || e.metaKey || e.altKey) return;
    if (e.target.closest('input, select, textarea')) { if (e.key === 'Escape') e.target.blur(); return; }
    const k = e.key;
    const help = document.getElementById('help');
    if (k === '?') { help.hidden = !help.hidden; document.getElementById('help-btn').setAttribute('aria-expanded', String(!help.hidden)); e.preventDefault(); return; }
    let done = true;
    if (DATA.kind === 'rank') {
      const r = DATA.ranking, c = r.cands[rankSel], a = document.getElementById(`audio-${rankSel}`);
      const after = document.getElementById('ref-0') || document.getElementById('ctx-0');
      if (k === 'j' || k === 'ArrowDown') selectCand(rankSel + 1);
      else if (k === 'k' || k === 'ArrowUp') selectCand(rankSel - 1);
      else if (k === 'p') toggle(a, c.id);
      else if (k === 'a') playSeq(after ? [[a, c.id], [after, r.ref ? 'the reference' : 'context clip 1']] : [[a, c.id]]);
      else if (k === 'r') toggle(after, 'the reference');
      else done = false;
    } else if (current) {
      const t = current.t[turnSel];
      if (k === 'j' || k === 'ArrowDown') selectTurn(turnSel + 1, true);
      else if (k === 'k' || k === 'ArrowUp') selectTurn(turnSel - 1, true);
      else if (k === 'f') {
        const n = current.t.length;
        for (let s = 1; s <= n; s++) { const j = (turnSel + s) % n; if (current.t[j].st === 'inconsistent') { selectTurn(j, true); break; } }
      } else if (k === 'p' && t) toggle(document.getElementById(`audio-${turnSel}`), t.id);
      else if (k === 'r' && t) { const ref = refFor(current, turnSel); toggle(ref && ref[0], ref ? ref[1] : `${t.s}'s reference`); }
      else if (k === 'a' && t) {
        const a = document.getElementById(`audio-${turnSel}`), ref = refFor(current, turnSel);
        if (!a) say(`${t.id} has no audio`); else playSeq(ref ? [[a, t.id], ref] : [[a, t.id]]);
      } else if (k === 'n' || k === 'ArrowRight') go(1);
      else if (k === 'b' || k === 'ArrowLeft') go(-1);
      else if (k === 'Escape' || k === 'u') { stopAll(); location.hash = ''; }
      else done = false;
    } else {
      if (k === 'j' || k === 'ArrowDown') moveSel(1);
      else if (k === 'k' || k === 'ArrowUp') moveSel(-1);
      else if (k === 'Enter' || k === 'o') { if (view.length) location.hash = `d=${view[st.sel]}`; }
      else if (k === ']') page(1);
      else if (k === '[') page(-1);
      else if (k === '/') document.getElementById('f-q')?.focus();
      else done = false;
    }
    if (done) e.preventDefault();
  });
  document.getElementById('help-btn').addEventListener('click', (e) => {
    const help = document.getElementById('help');
    help.hidden = !help.hidden; e.currentTarget.setAttribute('aria-expanded', String(!help.hidden));
  });
  const encs = [...new Set(dialogues.map((d) => d.enc).filter(Boolean))];
  document.getElementById('meta').textContent = (DATA.kind === 'rank' ? 'ranking' : `${dialogues.length} dialogue(s)`) +
    (encs.length ? ` · encoder ${encs.join(', ')}` : '') + ` · sleuthd ${DATA.version} · ${DATA.generated}`;
  window.addEventListener('hashchange', route);
  filter(); // the order a dialogue opened by its address steps through with n / b
  route();
  performance.mark('sleuthd:rendered');
  // The first frame after the script: a task queued from the next animation frame runs after its paint.
  requestAnimationFrame(() => setTimeout(() => performance.mark('sleuthd:painted'), 0));
})();
