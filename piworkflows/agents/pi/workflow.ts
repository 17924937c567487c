/**
 * The `workflow` tool: how a Pi agent hands a workflow step's result (or a progress note) to the
 * pi-workflows server that gave it the step.
 *
 *   model ── workflow {action: "submit", requestId, output} ──> this tool
 *     ── client.v1 interaction.submit {targetSessionId, coordinatorEpoch, requestId,
 *        submissionId: "submit-<uuid>", value: {output}} on PI_WORKFLOWS_SOCKET ──> server
 *     <── the verdict, once a supervised child validated the output
 *   accepted: "Accepted" (terminate: the turn ends); validationFailed: an error the model fixes;
 *   validatorFailed: the output could not be judged (the validator broke): submit again;
 *   winnerDecided: already accepted; anything else: the step is no longer waiting.
 *
 * Registered only when PI_WORKFLOWS_SOCKET is set (the agent host sets it, with
 * PI_WORKFLOWS_SESSION_ID and PI_WORKFLOWS_EPOCH). Transport errors (no server, a lost
 * connection, a server that cannot answer durably now) are retried with the same submission id
 * until the turn is aborted. Pi loads this file with jiti: only node: builtins and the packages
 * Pi provides to extensions are imported (docs/extensions.md, Available Imports).
 */

import { randomUUID } from "node:crypto";
import { createConnection } from "node:net";
import type { ExtensionAPI } from "@mariozechner/pi-coding-agent";
import { StringEnum } from "@mariozechner/pi-ai";
import { Type } from "typebox";

const SCHEMA = "pi-workflows.client.v1";
const MAX_MESSAGE_BYTES = 1_048_576; // a client.v1 message, newline included
const MAX_UPDATE_CHARS = 2000;
const RETRY_MIN_MS = 100;
const RETRY_MAX_MS = 2000;
const FAULT_AFTER_SUBMIT_SENT = "tool.after_submit_sent"; // piworkflows/faults.py names it too

type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

interface Response {
	outcome: string;
	receipt?: { code?: string; [key: string]: unknown };
	error?: string;
}

/** The connection failed or the server cannot answer durably now: the same request is sent again. */
class TransportError extends Error {}

/** JSON.stringify of the value with every object's keys inserted in sorted (UTF-16) order: the
 * canonical form client.v1 requires (index keys come first by themselves). */
function canonical(value: unknown): unknown {
	if (Array.isArray(value)) return value.map(canonical);
	if (value !== null && typeof value === "object") {
		const sorted: Record<string, unknown> = {};
		for (const key of Object.keys(value).sort()) sorted[key] = canonical((value as Record<string, unknown>)[key]);
		return sorted;
	}
	return value;
}

/** PIW_FAULTS (piworkflows/faults.py): "point=crash", optionally "@N" or "@N-M" (hits, from 1). */
const faultHits = new Map<string, number>();
function hitFault(point: string): void {
	for (const item of (process.env.PIW_FAULTS ?? "").split(",")) {
		const [name, action = ""] = item.trim().split("=");
		if (name !== point) continue;
		const [what, window] = action.split("@");
		const hits = (faultHits.get(point) ?? 0) + 1;
		faultHits.set(point, hits);
		const [first, last] = window ? window.split("-").map(Number) : [undefined, undefined];
		if (first !== undefined && !(first <= hits && hits <= (last ?? first))) return;
		if (what === "crash") process.kill(process.pid, "SIGKILL");
	}
}

function sleep(ms: number, signal: AbortSignal | undefined): Promise<void> {
	return new Promise((resolve, reject) => {
		if (signal?.aborted) return reject(new Error("The workflow tool call was aborted."));
		const onAbort = () => {
			clearTimeout(timer);
			reject(new Error("The workflow tool call was aborted."));
		};
		const timer = setTimeout(() => {
			signal?.removeEventListener("abort", onAbort);
			resolve();
		}, ms);
		signal?.addEventListener("abort", onAbort, { once: true });
	});
}

/** One request on a new connection: the server's hello, the request, its response. */
function requestOnce(
	socketPath: string,
	line: string,
	requestId: string,
	afterSent: () => void,
	signal: AbortSignal | undefined,
): Promise<Response> {
	return new Promise((resolve, reject) => {
		const socket = createConnection({ path: socketPath });
		let buffer = "";
		let greeted = false;
		let settled = false;
		const finish = (error: Error | null, response?: Response) => {
			if (settled) return;
			settled = true;
			signal?.removeEventListener("abort", onAbort);
			socket.destroy();
			if (error) reject(error);
			else resolve(response as Response);
		};
		const onAbort = () => finish(new Error("The workflow tool call was aborted."));
		signal?.addEventListener("abort", onAbort, { once: true });
		socket.setEncoding("utf8");
		socket.on("error", (error) => finish(new TransportError(error.message)));
		socket.on("close", () => finish(new TransportError("the server closed the connection")));
		socket.on("data", (chunk: string) => {
			buffer += chunk;
			// client.v1 lines end with LF only (a JSON string may hold U+2028).
			for (let end = buffer.indexOf("\n"); end !== -1; end = buffer.indexOf("\n")) {
				const text = buffer.slice(0, end);
				buffer = buffer.slice(end + 1);
				if (text.length === 0) continue;
				let message: Record<string, unknown>;
				try {
					message = JSON.parse(text);
				} catch {
					return finish(new TransportError("the server sent a line that is not JSON"));
				}
				if (!greeted) {
					if (message.type !== "hello") return finish(new TransportError(String(message.error ?? "refused")));
					greeted = true;
					socket.write(line, () => afterSent());
				} else if (message.type === "response" && message.requestId === requestId) {
					const response = message as unknown as Response;
					if (response.outcome === "unavailable") return finish(new TransportError(response.error ?? "unavailable"));
					return finish(null, response);
				}
			}
		});
	});
}

/** The operation's response, retrying transport errors (same idempotency key) until aborted. */
async function request(
	operation: string,
	idempotencyKey: string,
	payload: Json,
	signal: AbortSignal | undefined,
	afterSent: () => void = () => {},
): Promise<Response> {
	const socketPath = process.env.PI_WORKFLOWS_SOCKET as string;
	const clientId = `pi-workflows-tool:${process.env.PI_WORKFLOWS_SESSION_ID}`;
	let delay = RETRY_MIN_MS;
	for (;;) {
		const requestId = `tool-${randomUUID()}`;
		const envelope = { clientId, idempotencyKey, operation, payload, requestId, schema: SCHEMA, type: "request" };
		const line = `${JSON.stringify(canonical(envelope))}\n`;
		if (Buffer.byteLength(line) > MAX_MESSAGE_BYTES)
			throw new Error("The output is larger than the workflow server accepts (1 MiB). Submit a smaller output.");
		try {
			return await requestOnce(socketPath, line, requestId, afterSent, signal);
		} catch (error) {
			if (!(error instanceof TransportError)) throw error;
		}
		await sleep(delay, signal);
		delay = Math.min(delay * 2, RETRY_MAX_MS);
	}
}

function session(requestId: string): { targetSessionId: string; coordinatorEpoch: number; requestId: string } {
	const targetSessionId = process.env.PI_WORKFLOWS_SESSION_ID;
	const coordinatorEpoch = Number(process.env.PI_WORKFLOWS_EPOCH);
	if (!targetSessionId || !Number.isInteger(coordinatorEpoch) || coordinatorEpoch < 1)
		throw new Error("The workflow tool is not set up: PI_WORKFLOWS_SESSION_ID and PI_WORKFLOWS_EPOCH are missing.");
	return { targetSessionId, coordinatorEpoch, requestId };
}

function notWaiting(response: Response): Error {
	return new Error(`The workflow step is no longer waiting: ${response.error ?? response.outcome}`);
}

const text = (value: string) => [{ type: "text" as const, text: value }];

export default function (pi: ExtensionAPI) {
	if (!process.env.PI_WORKFLOWS_SOCKET) return;
	pi.registerTool({
		name: "workflow",
		label: "Workflow",
		description:
			"Hand a workflow step's result to the workflow that gave you the step (action submit, with the step's " +
			"requestId and its output), or report progress on it (action update).",
		promptSnippet: "Submit a workflow step's result, or report progress on the step",
		promptGuidelines: [
			"When a message carries a workflow step contract, complete the step by calling the workflow tool with " +
				'action "submit", the exact requestId of the contract and the output it describes.',
			"If the workflow tool reports a validation error, correct the output and call it again.",
		],
		parameters: Type.Object({
			action: StringEnum(["submit", "update"] as const, { description: "submit the result, or update progress" }),
			requestId: Type.String({ description: "the requestId of the step contract" }),
			output: Type.Optional(Type.Any({ description: "the step's result (submit), as the contract describes" })),
			update: Type.Optional(
				Type.Object({
					message: Type.String({ maxLength: MAX_UPDATE_CHARS, description: "a short progress note" }),
					progress: Type.Optional(Type.Number({ minimum: 0, maximum: 1, description: "done, from 0 to 1" })),
				}),
			),
		}),

		async execute(_toolCallId, params, signal) {
			const target = session(params.requestId);
			if (params.action === "update") {
				if (!params.update) throw new Error('An update needs "update": {"message": "..."}.');
				const update: Json = { message: params.update.message };
				if (params.update.progress !== undefined) update.progress = params.update.progress;
				const response = await request("interaction.update", `update-${randomUUID()}`, { ...target, update }, signal);
				if (response.outcome !== "accepted" && response.outcome !== "adopted") throw notWaiting(response);
				return { content: text("Progress recorded."), details: {} };
			}
			if (params.output === undefined) throw new Error('A submission needs "output": the step\'s result.');
			const submissionId = `submit-${randomUUID()}`;
			const payload: Json = { ...target, submissionId, value: { output: params.output as Json } };
			const response = await request("interaction.submit", submissionId, payload, signal, () =>
				hitFault(FAULT_AFTER_SUBMIT_SENT),
			);
			if (response.outcome === "accepted" || response.outcome === "adopted")
				return { content: text("Accepted"), details: {}, terminate: true };
			const code = response.receipt?.code;
			if (response.outcome === "rejected" && code === "validationFailed")
				throw new Error(`${response.error ?? "The output is not valid."} Fix the output and call the workflow tool again.`);
			if (response.outcome === "rejected" && code === "validatorFailed")
				throw new Error(`${response.error ?? "The output could not be validated."} Call the workflow tool again.`);
			if (response.outcome === "conflict" && code === "winnerDecided")
				return { content: text("The step's output was already accepted."), details: {}, terminate: true };
			throw notWaiting(response);
		},
	});
}
