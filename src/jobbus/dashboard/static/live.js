// Live updates: one event stream per tab; on each change the page's own HTML is fetched again and
// swapped in, unless the user is pressing a button, selecting, typing or has typed something not sent
// yet (checked when the fetch starts and again when it lands); the refresh skipped meanwhile runs when
// the user lets go or leaves the field. What the user unfolded stays unfolded. Confirmation for destructive actions.
(function () {
  "use strict";
  var main = document.getElementById("main"), dot = document.getElementById("live"), busy = false, pending = false;
  var pressed = false;  // a button is held down: a swap now would turn the click into a press on nothing
  var some = function (list, test) { return Array.prototype.some.call(list, test); };
  function edited() {  // a value typed or chosen in a form and not sent yet
    return some(main.querySelectorAll("input:not([type=checkbox]):not([type=hidden]):not([type=submit]), textarea"),
                function (i) { return i.value !== i.defaultValue; }) ||
      some(main.querySelectorAll("select"), function (s) {
        if (s.multiple) return some(s.options, function (o) { return o.selected !== o.defaultSelected; });
        var chosen = Array.prototype.findIndex.call(s.options, function (o) { return o.defaultSelected; });
        return s.selectedIndex !== Math.max(chosen, 0);  // with none marked, the first is the default
      });
  }
  function idle() {
    var a = document.activeElement;
    return !pressed && !main.querySelector("input[type=checkbox]:checked") &&
      !(a && /INPUT|SELECT|TEXTAREA/.test(a.tagName)) && !edited();
  }
  function refresh() {
    if (busy) return;
    if (!idle()) { pending = true; return; }
    busy = true;
    pending = false;
    fetch(location.href, {headers: {"X-Jobbus-Fragment": "1"}, credentials: "same-origin"})
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (html === null) return;
        var doc = new DOMParser().parseFromString(html, "text/html"), fresh = doc.getElementById("main");
        if (!fresh) return;
        if (!idle()) { pending = true; return; }  // the user started typing while the page was fetched
        var flash = main.querySelector("p.flash");  // the outcome of the last action stays in view
        var opened = Array.prototype.map.call(main.querySelectorAll("details[open][data-key]"),
                                              function (d) { return d.dataset.key; });
        main.innerHTML = fresh.innerHTML;
        main.querySelectorAll("details[data-key]").forEach(function (d) {  // what the user opened stays open
          if (opened.indexOf(d.dataset.key) >= 0) d.open = true;
        });
        if (flash && !main.querySelector("p.flash")) main.prepend(flash);
        main.dispatchEvent(new Event("jobbus:refreshed"));
      })
      .finally(function () { busy = false; });
  }
  function fillCounts() {  // a search's tab counts, read after the page (each tests the text on its tab's jobs)
    var tabs = main.querySelector("[data-counts]");
    if (!tabs) return;
    fetch(tabs.dataset.counts, {headers: {"Accept": "application/json"}, credentials: "same-origin"})
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (counts) {
        if (!counts) return;
        Object.keys(counts).forEach(function (tab) {
          var span = tabs.querySelector('[data-tab="' + tab + '"] .count[data-later]');
          if (!span) return;
          span.textContent = counts[tab].text;
          if (counts[tab].title) span.title = counts[tab].title; else span.removeAttribute("title");
          span.removeAttribute("data-later");
        });
      });
  }
  fillCounts();
  main.addEventListener("jobbus:refreshed", fillCounts);
  if (window.EventSource && document.body.dataset.events) {
    var source = new EventSource(document.body.dataset.events);
    source.addEventListener("change", refresh);
    source.onopen = function () { dot.className = "live on"; };
    source.onerror = function () { dot.className = "live off"; };
  }
  function later() { setTimeout(function () { if (pending && idle()) refresh(); }, 0); }
  document.addEventListener("focusout", later);
  document.addEventListener("pointerdown", function () { pressed = true; }, true);
  ["pointerup", "pointercancel"].forEach(function (name) {
    document.addEventListener(name, function () { pressed = false; later(); }, true);
  });
  document.addEventListener("submit", function (e) {
    // A form asks before it is sent when it, or the button that sent it, carries data-confirm.
    var message = (e.submitter && e.submitter.getAttribute("data-confirm")) || e.target.getAttribute("data-confirm");
    if (message && !window.confirm(message)) e.preventDefault();
  });
  document.addEventListener("change", function (e) {
    if (e.target.matches("[data-select-all]")) {
      main.querySelectorAll("input[name=ids]").forEach(function (box) { box.checked = e.target.checked; });
    }
  });
})();
