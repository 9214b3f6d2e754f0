-- A headless check of `kvpolicy lsp` from Neovim (0.7 and later: vim.lsp.start_client).
--   nvim --headless -n -u NONE -c "luafile editors/neovim/headless-check.lua"
-- KVPOLICY names the kvpolicy executable (default: kvpolicy on PATH). It opens a policy with
-- two mistakes, waits for their diagnostics, asks for a hover and completions, fixes the
-- text, waits for the diagnostics to go, formats through the server, prints what it saw
-- and exits 0 only if each step gave what it should.
local dir = vim.fn.tempname()
vim.fn.mkdir(dir, "p")
local file = dir .. "/bad.kvp"
vim.fn.writefile({ "version 1", 'model "a" {', "    reserve 4 GiBB", "  enigne vllm", "}" }, file)
local failures = 0
local function check(ok, what)
  print((ok and "ok   " or "FAIL ") .. what)
  if not ok then failures = failures + 1 end
end

vim.cmd("edit " .. file)
local buf = vim.api.nvim_get_current_buf()
local id = vim.lsp.start_client({
  name = "kvpolicy",
  cmd = { os.getenv("KVPOLICY") or "kvpolicy", "lsp" },
  root_dir = dir,
  settings = { kvpolicy = { gpuCapacity = "141GiB" } },
})
vim.lsp.buf_attach_client(buf, id)
local client = vim.lsp.get_client_by_id(id)
local uri = vim.uri_from_bufnr(buf)

check(vim.wait(60000, function() return #vim.diagnostic.get(buf) == 2 end, 50), "two diagnostics")
local codes = {}
for _, d in ipairs(vim.diagnostic.get(buf)) do table.insert(codes, string.format("%d:%d %s", d.lnum, d.col, d.code)) end
table.sort(codes)
check(table.concat(codes, ", ") == "2:14 KV001, 3:2 KV004", "at 2:14 KV001 and 3:2 KV004: " .. table.concat(codes, ", "))

local r = client.request_sync("textDocument/hover", { textDocument = { uri = uri }, position = { line = 2, character = 6 } }, 20000, buf)
local hover = r and r.result and r.result.contents.value or ""
check(hover:find("| `reserve` | size |", 1, true) ~= nil, "hover on reserve shows its reference line")

r = client.request_sync("textDocument/completion", { textDocument = { uri = uri }, position = { line = 4, character = 0 } }, 20000, buf)
local labels = {}
for _, item in ipairs(r and r.result and r.result.items or {}) do table.insert(labels, item.label) end
check(table.concat(labels, " ") == "engine priority min max weight pool", "completion: " .. table.concat(labels, " "))

vim.api.nvim_buf_set_lines(buf, 2, 4, false, { "    reserve 4 GiB", "  engine vllm" })
check(vim.wait(60000, function() return #vim.diagnostic.get(buf) == 0 end, 50), "diagnostics gone after the fix")

if vim.lsp.buf.format then vim.lsp.buf.format({ timeout_ms = 20000 }) else vim.lsp.buf.formatting_sync(nil, 20000) end
local text = table.concat(vim.api.nvim_buf_get_lines(buf, 0, -1, false), "\n")
check(text == 'version 1\n\nmodel "a" {\n  reserve 4 GiB\n  engine vllm\n}', "formatted")

vim.lsp.stop_client(id)
vim.wait(10000, function() return vim.lsp.client_is_stopped(id) end, 50)
vim.cmd(failures == 0 and "qall!" or "cquit!")
