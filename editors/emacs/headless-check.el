;;; headless-check.el --- a headless check of `kvpolicy lsp' from Emacs with eglot  -*- lexical-binding: t -*-
;;   emacs --batch -Q -l editors/emacs/headless-check.el
;; KVPOLICY names the kvpolicy executable (default: kvpolicy on PATH). It opens a policy with
;; two mistakes, waits for their diagnostics, asks for a hover, fixes the text, waits for the
;; diagnostics to go, formats through the server, prints what it saw, and exits 0 only if
;; each step gave what it should. (Emacs 28 with ELPA's eglot, or Emacs 29+.)
(dolist (dir (file-expand-wildcards "/usr/share/emacs/site-lisp/elpa/*"))
  (add-to-list 'load-path dir))
(require 'eglot)
(require 'flymake)

(define-derived-mode kvpolicy-mode prog-mode "kvpolicy" (setq-local comment-start "# "))
(add-to-list 'auto-mode-alist '("\\.kvp\\'" . kvpolicy-mode))
(add-to-list 'eglot-server-programs `(kvpolicy-mode . (,(or (getenv "KVPOLICY") "kvpolicy") "lsp")))

(defvar kvp-failures 0)
(defun kvp-check (ok what)
  (message "%s%s" (if ok "ok   " "FAIL ") what)
  (unless ok (setq kvp-failures (1+ kvp-failures))))
(defun kvp-wait (predicate)
  (let ((deadline (+ (float-time) 60)))
    (while (and (< (float-time) deadline) (not (funcall predicate)))
      (accept-process-output nil 0.05))
    (funcall predicate)))

(let* ((dir (make-temp-file "kvpolicy" t))
       (file (expand-file-name "bad.kvp" dir)))
  (with-temp-file file (insert "version 1\nmodel \"a\" {\n    reserve 4 GiBB\n  enigne vllm\n}\n"))
  (let ((default-directory dir)) (find-file file))
  (apply #'eglot (eglot--guess-contact))  ; eglot-ensure waits for a command loop that batch mode has not
  (kvp-check (kvp-wait #'eglot-current-server) "connected")
  (kvp-check (kvp-wait (lambda () (= (length (flymake-diagnostics)) 2))) "two diagnostics")
  (let ((seen (sort (mapcar (lambda (d) (format "%d %s" (line-number-at-pos (flymake-diagnostic-beg d))
                                               (car (split-string (flymake-diagnostic-text d) ":"))))
                            (flymake-diagnostics))
                    #'string<)))
    (kvp-check (equal seen '("3 kvpolicy [KV001]" "4 kvpolicy [KV004]")) (format "KV001 on line 3, KV004 on line 4: %S" seen)))
  (goto-char (point-min)) (search-forward "reserve")
  (let* ((hover (jsonrpc-request (eglot-current-server) :textDocument/hover (eglot--TextDocumentPositionParams)))
         (text (plist-get (plist-get hover :contents) :value)))
    (kvp-check (and text (string-match-p (regexp-quote "| `reserve` | size |") text)) "hover on reserve shows its reference line"))
  ;; Keystroke-like edits: eglot 1.9 reports a `replace-match' with the range's end already
  ;; moved (end 2:17 for the 4 characters of "GiBB"), which no server can apply right.
  (goto-char (point-min)) (search-forward "GiBB") (delete-char -1)
  (goto-char (point-min)) (search-forward "enigne") (delete-region (- (point) 6) (point)) (insert "engine")
  (eglot--signal-textDocument/didChange)  ; eglot sends changes from an idle timer, which batch mode never runs
  (kvp-check (kvp-wait (lambda () (null (flymake-diagnostics)))) "diagnostics gone after the fix")
  (eglot-format-buffer)
  (kvp-check (equal (buffer-substring-no-properties (point-min) (point-max))
                    "version 1\n\nmodel \"a\" {\n  reserve 4 GiB\n  engine vllm\n}\n")
             "formatted")
  (set-buffer-modified-p nil)
  (ignore-errors (eglot-shutdown (eglot-current-server))))
(kill-emacs (if (= kvp-failures 0) 0 1))
