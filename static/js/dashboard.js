/* Surety dashboard: keyboard shortcuts and small conveniences.
 *
 * Everything here is an enhancement: every control is a plain link or form that works
 * without it. Loaded with `defer` from static (the CSP allows no inline script).
 *
 * Queues (pages with .queue-row rows): j / k select the next / previous row, Enter opens it,
 * r opens the selected row's "Reject…" with its reason (or the first one given before) focused.
 * Review item: a approves (or releases) with the reason written, or asks for one, with the
 * button's data-confirm question where it has one (above the two-approver threshold); r
 * focuses the reason, and rejects when a reason is written. Escape leaves a text field so
 * the shortcuts work again.
 * Reasons given before (.reason-choice buttons, each a whole decision): 1, 2, 3 press the
 * first, second, third of the selected row's open "Reject…", else of the page's choices; a
 * choice above the two-approver threshold asks its data-confirm question first. Opening a
 * "Reject…" focuses its first such reason, else its reason field.
 */
(function () {
  "use strict";

  // --- helpers -------------------------------------------------------------------------------

  function isTyping(target) {
    if (!target || !target.closest) return false;
    if (target.isContentEditable) return true;
    var field = target.closest("input, textarea, select, [contenteditable]");
    if (!field) return false;
    // Checkboxes, radios and buttons do not take text: shortcuts still apply there.
    var type = (field.getAttribute("type") || "").toLowerCase();
    return !(field.tagName === "INPUT" && ["checkbox", "radio", "button", "submit", "reset"].indexOf(type) >= 0);
  }

  // --- queues: j / k / Enter -----------------------------------------------------------------

  var selectedId = null; // survives htmx swaps of the rows

  function rows() {
    return Array.prototype.slice.call(document.querySelectorAll(".queue-row"));
  }

  function select(row, focus) {
    rows().forEach(function (r) {
      if (r !== row) r.removeAttribute("aria-selected");
    });
    if (!row) return;
    row.setAttribute("aria-selected", "true");
    selectedId = row.getAttribute("data-id");
    row.scrollIntoView({ block: "nearest" });
    var link = row.querySelector("a[href]");
    if (focus && link) link.focus({ preventScroll: true });
  }

  function move(step) {
    var all = rows();
    if (!all.length) return false;
    var current = all.findIndex(function (r) { return r.getAttribute("aria-selected") === "true"; });
    if (current < 0) {
      // Start from the row holding focus, if any, else from the edge we move away from.
      current = all.findIndex(function (r) { return r.contains(document.activeElement); });
    }
    var next = current < 0 ? (step > 0 ? 0 : all.length - 1) : Math.min(all.length - 1, Math.max(0, current + step));
    select(all[next], true);
    return true;
  }

  function openSelected() {
    var row = document.querySelector('.queue-row[aria-selected="true"]');
    var link = row && row.querySelector("a[href]");
    if (!link) return false;
    window.location.assign(link.href);
    return true;
  }

  // A click on a row (outside its link) selects it, so j/k continue from there; so does the
  // keyboard's focus coming into it (Tab), which a refresh of the rows then keeps on that row.
  function selectFrom(event) {
    var row = event.target.closest && event.target.closest(".queue-row");
    if (row) select(row, false);
  }
  document.addEventListener("click", selectFrom);
  document.addEventListener("focusin", selectFrom);

  // --- review item: a / r ----------------------------------------------------------------------

  function decisionButton(values) {
    var form = document.getElementById("decision-form");
    if (!form) return null;
    for (var i = 0; i < values.length; i++) {
      var button = form.querySelector('button[name="decision"][value="' + values[i] + '"]');
      if (button && !button.disabled) return button;
    }
    return null;
  }

  function approve() {
    var button = decisionButton(["approve", "release"]);
    var reason = document.getElementById("reason");
    if (!button || !reason) return false;
    var question = button.getAttribute("data-confirm");
    if (reason.value.trim()) {
      if (!question || window.confirm(question)) button.click();
      return true;
    }
    // Every decision gives its reason: asked here (with the threshold's question, if any), so
    // that a stays one key and one answer. Cancelled or left blank, the reason field waits.
    var given = window.prompt((question ? question + " " : "") + "Reason to " + button.value + " (recorded in the audit log):");
    if (given && given.trim()) {
      reason.value = given;
      button.click();
    } else {
      reason.focus();
    }
    return true;
  }

  function rejectSelectedRow() {
    var row = document.querySelector('.queue-row[aria-selected="true"]');
    var details = row && row.querySelector("details.row-reject");
    if (!details) return false;
    details.open = true;
    focusReason(details);
    return true;
  }

  // An opened "Reject…" waits on its first reason given before (1 or Enter takes it), else on
  // its reason field.
  function focusReason(details) {
    // Without scrolling: the table's own scroll would move the row being rejected out of sight.
    (details.querySelector(".reason-choice") || details.querySelector("input[name=reason]")).focus({ preventScroll: true });
  }

  function reject() {
    if (rejectSelectedRow()) return true;
    var reason = document.getElementById("reason");
    if (!reason || !document.getElementById("decision-form")) return false;
    var button = decisionButton(["reject"]);
    if (button && reason.value.trim()) {
      button.click();
    } else {
      reason.focus();
    }
    return true;
  }

  // --- reasons given before: 1 / 2 / 3 --------------------------------------------------------

  function choose(n) {
    var open = document.querySelector('.queue-row[aria-selected="true"] details.row-reject[open]');
    var scope = open || document.getElementById("reason-choices");
    var choice = scope && scope.querySelectorAll(".reason-choice")[n - 1];
    if (!choice) return false;
    choice.click();
    return true;
  }

  document.addEventListener("click", function (event) {
    var choice = event.target.closest && event.target.closest(".reason-choice[data-confirm]");
    if (choice && !window.confirm(choice.getAttribute("data-confirm"))) event.preventDefault();
  });

  // A "Reject…" opened by a click waits for its reason as r opens it.
  document.addEventListener("toggle", function (event) {
    var details = event.target;
    if (details.matches && details.matches("details.row-reject") && details.open) focusReason(details);
  }, true);

  // --- the key handler -------------------------------------------------------------------------

  document.addEventListener("keydown", function (event) {
    if (event.defaultPrevented || event.ctrlKey || event.metaKey || event.altKey) return;
    if (isTyping(event.target)) {
      if (event.key === "Escape") event.target.blur();
      return;
    }
    var handled = false;
    switch (event.key) {
      case "j": handled = move(1); break;
      case "k": handled = move(-1); break;
      case "Enter":
        // A focused link or button already does the right thing on Enter.
        if (!event.target.closest || !event.target.closest("a, button, summary")) handled = openSelected();
        break;
      case "a": handled = approve(); break;
      case "r": handled = reject(); break;
      case "1": case "2": case "3": handled = choose(Number(event.key)); break;
    }
    if (handled) event.preventDefault();
  });

  // A queue refresh would replace a reason being written in a row's "Reject…": skip it meanwhile.
  document.addEventListener("htmx:beforeRequest", function (event) {
    var target = event.detail && event.detail.elt;
    if (target && target.id === "queue-rows" && target.querySelector("details.row-reject[open]")) {
      event.preventDefault();
    }
  });

  // After htmx refreshes a queue, keep the row the person had selected.
  document.addEventListener("htmx:afterSwap", function () {
    if (selectedId === null) return;
    var row = document.querySelector('.queue-row[data-id="' + CSS.escape(selectedId) + '"]');
    if (row) {
      var hadFocus = document.activeElement === document.body;
      select(row, hadFocus);
    }
    refreshTimes();
  });

  // --- relative times ------------------------------------------------------------------------
  // Same wording as Django's timesince/timeuntil (two adjacent units), refreshed each minute.

  var UNITS = [
    [365 * 24 * 3600, "year", "years"],
    [30 * 24 * 3600, "month", "months"],
    [7 * 24 * 3600, "week", "weeks"],
    [24 * 3600, "day", "days"],
    [3600, "hour", "hours"],
    [60, "minute", "minutes"],
  ];
  var NBSP = "\u00a0";

  function phrase(seconds) {
    for (var i = 0; i < UNITS.length; i++) {
      var count = Math.floor(seconds / UNITS[i][0]);
      if (count > 0) {
        var text = count + NBSP + (count === 1 ? UNITS[i][1] : UNITS[i][2]);
        if (i + 1 < UNITS.length) {
          var rest = Math.floor((seconds - count * UNITS[i][0]) / UNITS[i + 1][0]);
          if (rest > 0) text += ", " + rest + NBSP + (rest === 1 ? UNITS[i + 1][1] : UNITS[i + 1][2]);
        }
        return text;
      }
    }
    return "0" + NBSP + "minutes";
  }

  function refreshTimes() {
    var now = Date.now();
    document.querySelectorAll("time.reltime[datetime]").forEach(function (el) {
      var at = Date.parse(el.getAttribute("datetime"));
      if (isNaN(at)) return;
      var seconds = Math.round((at - now) / 1000);
      el.textContent = seconds > 0 ? "in " + phrase(seconds) : phrase(-seconds) + " ago";
    });
  }

  window.setInterval(refreshTimes, 60 * 1000);

  // --- small conveniences -------------------------------------------------------------------

  // "Copy" next to a one-time token.
  document.querySelectorAll("[data-copy]").forEach(function (button) {
    var source = document.querySelector(button.getAttribute("data-copy"));
    if (!source || !navigator.clipboard) return;
    button.hidden = false;
    button.addEventListener("click", function () {
      navigator.clipboard.writeText(source.textContent.trim()).then(function () {
        button.textContent = "Copied";
      });
    });
  });

  // "Edit" on a limit fills the form below with that row's values.
  document.querySelectorAll("[data-fill-limit]").forEach(function (button) {
    var form = document.getElementById("limit-form");
    if (!form) return;
    button.hidden = false;
    button.addEventListener("click", function () {
      var fields = {
        action_type: button.dataset.actionType,
        currency: button.dataset.currency,
        max_amount: button.dataset.maxAmount,
        dual_approval_above: button.dataset.dualApprovalAbove,
        daily_customer_total: button.dataset.dailyCustomerTotal,
        review_deadline_hours: button.dataset.reviewDeadlineHours,
        first_tier: button.dataset.firstTier,
        next_tier: button.dataset.nextTier,
        escalate_after_hours: button.dataset.escalateAfterHours,
        approval_expires_after_hours: button.dataset.approvalExpiresAfterHours,
      };
      Object.keys(fields).forEach(function (name) {
        var input = form.elements.namedItem(name);
        if (input) input.value = fields[name] || "";
      });
      var reason = form.elements.namedItem("reason");
      form.scrollIntoView({ block: "start" });
      if (reason) reason.focus({ preventScroll: true });
    });
  });
})();
