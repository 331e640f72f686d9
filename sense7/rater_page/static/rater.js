// Keyboard rating: a digit answers the question (fieldset) that has the focus; Enter submits (the form's
// own implicit submission). No inline script: the page's Content-Security-Policy allows only this file.
document.addEventListener("keydown", function (event) {
  if (event.altKey || event.ctrlKey || event.metaKey) return;
  var target = event.target;
  if (target && (target.tagName === "TEXTAREA" || (target.tagName === "INPUT" && target.type === "text"))) return;
  if (event.key === "Enter" && target && target.form && target.type === "radio") {
    event.preventDefault();  // browsers differ on Enter in a radio group: always save
    target.form.requestSubmit();
    return;
  }
  if (!/^[0-9]$/.test(event.key)) return;
  var group = target && target.closest ? target.closest("fieldset.control") : null;
  if (!group) return;
  var radios = group.querySelectorAll("input[type=radio]");
  var index = parseInt(event.key, 10) - 1;
  if (index < 0 || index >= radios.length) return;
  radios[index].checked = true;
  radios[index].focus();
  group.classList.remove("missing");
  event.preventDefault();
});
// Focus the first question on load, so that the keyboard works at once.
window.addEventListener("load", function () {
  var first = document.querySelector("fieldset.control input[type=radio]:checked, fieldset.control input[type=radio]");
  if (first) first.focus({preventScroll: true});
});
