// The API token dialog: a token is kept for this browser tab only (session storage).

const TOKEN_KEY = "kiln-token";

export function storedToken() {
  return sessionStorage.getItem(TOKEN_KEY);
}

export function askForToken(message) {
  const dialog = document.getElementById("login");
  document.getElementById("login-message").textContent = storedToken()
    ? `The server refused the token: ${message}`
    : `This Kiln server requires an API token. (${message})`;
  document.getElementById("token-button").hidden = false;
  if (!dialog.open) dialog.showModal();
}

// Wires the dialog and the "API token" button; onToken runs after a token is entered.
export function setUpTokenDialog(onToken) {
  document.getElementById("login-form").addEventListener("submit", () => {
    const token = document.getElementById("login-token").value.trim();
    if (token) sessionStorage.setItem(TOKEN_KEY, token);
    onToken();
  });
  document.getElementById("token-button").addEventListener("click", () => askForToken("enter a token"));
  if (storedToken()) document.getElementById("token-button").hidden = false;
}
