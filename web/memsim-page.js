// Page glue: sets up Emscripten's Module, file drop and paste, hash changes, and the public JS API
// window.memsim.estimate(configJson). No text from a link or file is ever inserted into the DOM as HTML:
// status messages use textContent only.
"use strict";
(function () {
  var statusEl = document.getElementById("status");
  function setStatus(text, isError) {
    statusEl.textContent = text;
    statusEl.className = isError ? "error" : (text ? "" : "hidden");
  }
  var readyResolve;
  var ready = new Promise(function (resolve) { readyResolve = resolve; });

  function callWithString(fn, text, extra) {
    var n = Module.lengthBytesUTF8(text) + 1, p = Module._malloc(n);
    Module.stringToUTF8(text, p, n);
    var q = 0;
    if (extra !== undefined) {
      var m = Module.lengthBytesUTF8(extra) + 1;
      q = Module._malloc(m);
      Module.stringToUTF8(extra, q, m);
    }
    try { return extra !== undefined ? fn(p, q) : fn(p); }
    finally { Module._free(p); if (q) Module._free(q); }
  }
  function takeString(ptr) {
    var s = Module.UTF8ToString(ptr);
    Module._free(ptr);
    return s;
  }

  window.memsim = {
    ready: ready,
    // Simulates a memsim config (JSON text or object) and returns the result object (see the CLI contract).
    estimate: function (config) {
      var text = typeof config === "string" ? config : JSON.stringify(config);
      return JSON.parse(takeString(callWithString(Module._memsim_estimate_json, text)));
    },
    // The interface's current config, fragment and messages.
    state: function () { return JSON.parse(takeString(Module._memsim_state_json())); },
    // Opens a link as if pasted: an applied change, a new entry in the browser's history.
    openFragment: function (fragment) { callWithString(Module._memsim_set_fragment, fragment); },
    loadText: function (text, origin) { callWithString(Module._memsim_load_text, text, origin || "the text"); },
  };

  // Start-up work that does not need the wasm module runs while memsim.js and memsim.wasm download:
  // - the wasm is fetched and compiled as it streams in (served as application/wasm), instead of only after memsim.js
  //   has been parsed and run; Module.instantiateWasm below instantiates the compiled module;
  // - the WebGL2 context is created now, with the attributes web_main.cpp asks GLFW for (no alpha, depth, stencil
  //   or antialiasing), so Emscripten's getContext call later gets this same context instead of waiting for one,
  //   and with its extensions on.
  var canvas = document.getElementById("canvas");
  var compiled = typeof WebAssembly.compileStreaming === "function"
    ? WebAssembly.compileStreaming(fetch("memsim.wasm", { credentials: "same-origin" })) : null;
  if (compiled) compiled.catch(function () {});  // handled in instantiateWasm
  try {
    var gl = canvas.getContext("webgl2", { alpha: false, depth: false, stencil: false, antialias: false });
    // Emscripten turns on every extension but the debug and lose_context ones when it takes the context over
    // (GL.initExtensions); turning them on now spares main() the round trips to the GPU process.
    if (gl) (gl.getSupportedExtensions() || []).forEach(function (ext) {
      if (ext.indexOf("lose_context") < 0 && ext.indexOf("debug") < 0) gl.getExtension(ext);
    });
  } catch (e) {}

  window.Module = {
    canvas: canvas,
    instantiateWasm: compiled ? function (imports, receiveInstance) {
      compiled.then(function (module) {
        return WebAssembly.instantiate(module, imports).then(function (instance) { receiveInstance(instance, module); });
      }, function () {  // e.g. a server that does not send application/wasm: compile from the bytes instead
        return fetch("memsim.wasm", { credentials: "same-origin" }).then(function (r) { return r.arrayBuffer(); })
          .then(function (bytes) { return WebAssembly.instantiate(bytes, imports); })
          .then(function (result) { receiveInstance(result.instance, result.module); });
      }).catch(function (e) { setStatus("memsim could not start: " + String(e) + ". Reload the page.", true); });
      return {};  // the exports arrive through receiveInstance
    } : undefined,
    print: function (t) { console.log(t); },
    printErr: function (t) { console.warn(t); },
    onRuntimeInitialized: function () {
      window.memsimRuntimeInitialized = performance.now();  // the wasm compiled and instantiated; main() runs next
      setStatus("", false);
      readyResolve(true);
    },
    onAbort: function (what) { setStatus("memsim stopped: " + String(what) + ". Reload the page.", true); },
  };

  // Input. The app draws only when something happens (src/platform/web_main.cpp): each event that can change what the
  // page shows wakes it. The wheel and one finger go to the app's own rules (src/ui/pointer.h) rather than to
  // Emscripten's GLFW, which hands ImGui the wheel's raw pixels with the sign reversed and turns a touch into a press
  // at the last mouse position: they are stopped here, at the window on their way down, before GLFW's listeners on the
  // canvas see them. Until main() runs, the app is not there to tell.
  function live() { return !!(window.Module && Module.calledRun && Module._memsim_wake); }
  ["keydown", "keyup", "keypress", "mouseup", "mouseenter", "mouseleave", "focus", "blur", "resize",
   "visibilitychange"].forEach(function (type) {
    window.addEventListener(type, function () { if (live()) Module._memsim_wake(); }, true);
  });
  ["mousemove", "mousedown"].forEach(function (type) {  // the mouse is the pointer again after a touch
    window.addEventListener(type, function () { if (live()) Module._memsim_mouse(); }, true);
  });
  function ours(e) {  // an event for the canvas, kept from GLFW and from the browser's own scrolling and zooming
    if (e.target !== canvas) return false;
    e.preventDefault();
    e.stopPropagation();
    return live();
  }
  window.addEventListener("wheel", function (e) {
    if (ours(e)) Module._memsim_wheel(e.deltaX, e.deltaY, e.deltaMode);
  }, { capture: true, passive: false });
  window.addEventListener("mousewheel", ours, { capture: true, passive: false });  // the legacy twin GLFW also hears
  // One finger at a time: the first one down is followed until it lifts; others are ignored. Stopping the touch also
  // stops the browser's emulated mouse events and click that would follow it.
  var finger = null;
  function onTouch(e) {
    if (!ours(e)) return;
    var rect = canvas.getBoundingClientRect();
    for (var i = 0; i < e.changedTouches.length; i++) {
      var t = e.changedTouches[i];
      if (e.type === "touchstart") {
        if (finger !== null) continue;
        finger = t.identifier;
        canvas.focus({ preventScroll: true });  // as a click would: an attached keyboard then reaches the app
      } else if (t.identifier !== finger) {
        continue;
      }
      var phase = { touchstart: 0, touchmove: 1, touchend: 2, touchcancel: 3 }[e.type];
      Module._memsim_touch(phase, t.clientX - rect.left, t.clientY - rect.top);
      if (phase >= 2) finger = null;
    }
  }
  ["touchstart", "touchmove", "touchend", "touchcancel"].forEach(function (type) {
    window.addEventListener(type, onTouch, { capture: true, passive: false });
  });

  window.addEventListener("error", function (e) { setStatus("Error: " + String(e.message), true); });
  // Back and Forward between the app's entries (it pushes one per applied change) fire popstate, and hashchange as
  // well; an edited address fires hashchange. Either opens the entry's setup, once, without a new entry; the app's
  // own pushState and replaceState fire neither (window.memsimHash is what it wrote).
  function navigated() {
    var hash = window.location.hash;
    if (hash === window.memsimHash) return;
    window.memsimHash = hash;
    ready.then(function () { callWithString(Module._memsim_navigate, hash); });
  }
  window.addEventListener("popstate", navigated);
  window.addEventListener("hashchange", navigated);

  // The clipboard of the app's text fields. Emscripten's GLFW has none, and the browser lets a page read a paste and
  // write a copy only in its clipboard events. So Ctrl+V and Ctrl+X are kept from GLFW (stopped here, before its
  // listeners on the window); the browser then fires paste or cut, and the app gets the pasted text with a Ctrl+V of
  // its own, or gives the cut text and then gets Ctrl+X (web_main.cpp memsim_paste, memsim_cut). Ctrl+C reaches the
  // app as usual; the copy event takes what it copies from the field (memsim_text_field_copy).
  var controlHeld = false;
  window.addEventListener("keydown", function (e) {
    if (e.key === "Control") controlHeld = true;
    if ((e.ctrlKey || e.metaKey) && !e.altKey && (e.keyCode === 86 || e.keyCode === 88)) {  // V, X
      e.stopImmediatePropagation();  // not preventDefault: the browser's paste or cut is to follow
      if (live()) Module._memsim_wake();
    }
  }, true);
  window.addEventListener("keyup", function (e) { if (e.key === "Control") controlHeld = false; }, true);
  window.addEventListener("blur", function () { controlHeld = false; }, true);
  function editingText() { return live() && Module._memsim_editing_text() !== 0; }
  function copyFromField(e, cut) {
    if (!editingText()) return;
    var p = Module._memsim_text_field_copy();
    if (!p) return;
    e.preventDefault();
    e.clipboardData.setData("text/plain", takeString(p));
    if (cut) Module._memsim_cut(controlHeld ? 1 : 0);
  }
  window.addEventListener("copy", function (e) { copyFromField(e, false); }, true);
  window.addEventListener("cut", function (e) { copyFromField(e, true); }, true);

  // Drop a memsim config, a Hugging Face config.json, a DeepSpeed or an Accelerate config, or a file of per-sample
  // token lengths, anywhere on the page (the app tells them apart). A file larger than a lengths file of ten million
  // samples can be is not read: the tab would hold it twice, as text here and in the wasm memory.
  window.addEventListener("dragover", function (e) { e.preventDefault(); });
  window.addEventListener("drop", function (e) {
    e.preventDefault();
    var file = e.dataTransfer && e.dataTransfer.files && e.dataTransfer.files[0];
    if (!file) return;
    // The name as text, cut and without control characters: it goes into the status line.
    var name = "\"" + String(file.name).replace(/[\u0000-\u001f\u007f]/g, "?").slice(0, 80) + "\"";
    // An empty text tells the app that nothing was read; the origin says why.
    if (file.size > 256 * 1024 * 1024) {
      var gib = (file.size / 1024 / 1024 / 1024).toFixed(1);
      ready.then(function () { window.memsim.loadText("", name + " (" + gib + " GiB; files over 256 MiB are not read)"); });
      return;
    }
    var reader = new FileReader();
    reader.onload = function () {
      var text = String(reader.result);
      // A NUL byte ends the C string the text becomes: a binary file would be read as its first few bytes.
      if (text.indexOf("\u0000") >= 0) name += " (a binary file: not a config or a file of sample lengths)";
      else if (text.trim() === "") name += " (empty)";
      ready.then(function () { window.memsim.loadText(text.indexOf("\u0000") >= 0 ? "" : text, name); });
    };
    reader.readAsText(file);
  });
  // Ctrl+V into a text field being edited pastes there. Outside one, paste a link, JSON (or an Accelerate config's
  // YAML); or sample lengths: a JSON array of numbers, or at least two lines of one number each.
  window.addEventListener("paste", function (e) {
    var text = e.clipboardData && e.clipboardData.getData("text");
    if (editingText()) {  // into the field being edited, whatever the text is
      e.preventDefault();
      if (text) callWithString(function (p) { return Module._memsim_paste(p, controlHeld ? 1 : 0); }, text);
      return;
    }
    if (!text) return;
    // A pasted memsim link (a whole URL or its fragment) opens as it would from the address bar; the app reads it,
    // ignoring what a chat client appended, and refuses one that was cut off or altered with a message.
    if (/(^|#)(memsim|schema)=\d/.test(text.trim())) {
      e.preventDefault();
      ready.then(function () { window.memsim.openFragment(text.trim()); });
      return;
    }
    var lengths = /^\s*(\[\s*[-+.\d]|[-+.\d][^\n]*\n\s*[-+.\d])/.test(text);
    if (text.trim().charAt(0) === "{" || /^(distributed_type|fsdp_config)\s*:/m.test(text) || lengths) {
      e.preventDefault();
      ready.then(function () { window.memsim.loadText(text, lengths ? "the pasted lengths" : "the pasted JSON"); });
    }
  });
})();
