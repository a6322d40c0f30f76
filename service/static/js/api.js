// Access to the REST API under /api/v1: JSON calls, downloads and the job event stream.

import { h } from "./dom.js";
import { askForToken, storedToken } from "./token.js";

const API = "/api/v1";

export class ApiError extends Error {
  constructor(status, kind, message) {
    super(message);
    this.status = status;
    this.kind = kind;
  }
}

function authHeaders() {
  const token = storedToken();
  return token ? { Authorization: `Bearer ${token}` } : {};
}

async function asApiError(response) {
  let kind = "http_error";
  let message = `${response.status} ${response.statusText}`;
  try {
    const body = await response.json();
    if (body && body.error) ({ kind, message } = body.error);
  } catch (_) { /* not JSON */ }
  if (response.status === 401) askForToken(message);
  return new ApiError(response.status, kind, message);
}

export async function api(path, { method = "GET", json, form } = {}) {
  const headers = authHeaders();
  let body;
  if (json !== undefined) {
    headers["Content-Type"] = "application/json";
    body = JSON.stringify(json);
  } else if (form !== undefined) {
    body = form;
  }
  const response = await fetch(path.startsWith("/") ? path : `${API}/${path}`, { method, headers, body });
  if (!response.ok) throw await asApiError(response);
  const type = response.headers.get("content-type") || "";
  return type.includes("application/json") ? response.json() : response;
}

export async function download(path, fallbackName) {
  const response = await fetch(`${API}/${path}`, { headers: authHeaders() });
  if (!response.ok) throw await asApiError(response);
  const disposition = response.headers.get("content-disposition") || "";
  const match = /filename="?([^";]+)"?/.exec(disposition);
  const url = URL.createObjectURL(await response.blob());
  const link = h("a", { href: url, download: match ? match[1] : fallbackName });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

// Server-Sent Events over fetch (EventSource cannot send an Authorization header).
export async function streamEvents(path, onEvent, signal) {
  const response = await fetch(`${API}/${path}`, { headers: authHeaders(), signal });
  if (!response.ok) throw await asApiError(response);
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer = (buffer + decoder.decode(value, { stream: true })).replace(/\r\n/g, "\n");
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      let event = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) event = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      }
      if (data.length) onEvent(event, JSON.parse(data.join("\n")));
    }
  }
}
