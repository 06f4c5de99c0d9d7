/* A bulk job's page (recoveryitem/bulk_job.html): polls the job's status while it runs and shows the
   counts; when it ends, the page is loaded once more so the skipped and failed items appear. A static
   file: the Content-Security-Policy allows no inline script. */
(function () {
  "use strict";
  var POLL_MS = 1000;

  function start() {
    var job = document.getElementById("bulk-job");
    if (!job || job.dataset.open !== "1") { return; }
    var url = job.dataset.statusUrl;
    var progress = document.getElementById("bulk-progress");

    function show(id, value) {
      var node = document.getElementById(id);
      if (node) { node.textContent = String(value); }
    }

    function poll() {
      fetch(url, {credentials: "same-origin", headers: {"Accept": "application/json"}})
        .then(function (response) {
          if (!response.ok) { throw new Error("status " + response.status); }
          return response.json();
        })
        .then(function (status) {
          show("bulk-done", status.done);
          show("bulk-total", status.total);
          show("bulk-succeeded", status.succeeded);
          show("bulk-skipped", status.skipped);
          show("bulk-failed", status.failed);
          show("bulk-state", status.state_label);
          if (progress) {
            progress.max = Math.max(status.total, 1);
            progress.value = status.done;
            progress.textContent = status.done + " of " + status.total;
          }
          job.dataset.state = status.state;
          if (status.open) {
            window.setTimeout(poll, POLL_MS);
          } else {
            window.location.reload();
          }
        })
        .catch(function () { window.setTimeout(poll, POLL_MS * 3); });
    }

    window.setTimeout(poll, POLL_MS);
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
