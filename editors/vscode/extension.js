// Starts `kvpolicy lsp` for .kvp policies and their .kvtest.json tests.
const vscode = require("vscode");
const { LanguageClient } = require("vscode-languageclient/node");

let client;

function activate(context) {
  const [command, ...args] = vscode.workspace.getConfiguration("kvpolicy").get("command");
  client = new LanguageClient(
    "kvpolicy",
    "kvpolicy",
    { command, args },
    {
      documentSelector: [
        { scheme: "file", language: "kvpolicy" },
        { scheme: "file", pattern: "**/*.kvtest.json" },
      ],
      synchronize: { configurationSection: "kvpolicy" },
    },
  );
  context.subscriptions.push(client);
  return client.start();
}

function deactivate() {
  return client ? client.stop() : undefined;
}

module.exports = { activate, deactivate };
