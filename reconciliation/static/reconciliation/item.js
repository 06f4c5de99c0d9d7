// The recovery item's page: a Copy button (data-copy="value") copies its value, since long keys and
// references are shown cut short. A static file: the Content-Security-Policy allows no inline script.
(function () {
  "use strict";

  function fallbackCopy(text) {
    // navigator.clipboard needs a secure context (https or localhost); elsewhere copy through a selection.
    var area = document.createElement("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.className = "copy-buffer";
    document.body.appendChild(area);
    area.select();
    var done = false;
    try { done = document.execCommand("copy"); } catch (e) { done = false; }
    document.body.removeChild(area);
    return done ? Promise.resolve() : Promise.reject(new Error("copy refused"));
  }

  function say(button, text) {
    var label = button.getAttribute("data-label") || button.textContent;
    button.setAttribute("data-label", label);
    button.textContent = text;
    button.classList.toggle("copied", text === "Copied");
    window.setTimeout(function () {
      button.textContent = label;
      button.classList.remove("copied");
    }, 1500);
  }

  document.addEventListener("click", function (event) {
    var button = event.target.closest ? event.target.closest("button[data-copy]") : null;
    if (!button) { return; }
    event.preventDefault();
    var text = button.getAttribute("data-copy") || "";
    var copying = navigator.clipboard && window.isSecureContext
      ? navigator.clipboard.writeText(text) : fallbackCopy(text);
    copying.then(function () { say(button, "Copied"); }, function () { say(button, "Copy failed"); });
  });
}());
