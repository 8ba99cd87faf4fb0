// A TypeScript client of the operators' service, typed by openapi-typescript
// from the served OpenAPI document (`scheduler.d.ts` beside this file) and
// calling a live server with fetch: tests/it/openapi_clients.rs compiles it
// with `tsc --strict` and runs it with node.
//
// Usage: node typescript_admin.js BASE_URL ADMIN_TOKEN
// Prints "all TypeScript client checks passed", or exits non-zero naming the
// failed check.
import type { components, paths } from "./scheduler";

type Schemas = components["schemas"];
type Rpc<Path extends keyof paths> = paths[Path] extends {
  post: {
    requestBody?: { content: { "application/json": infer Request } };
    responses: { 200: { content: { "application/json": infer Response } } };
  };
}
  ? { request: Request; response: Response }
  : never;

type Cordon = Rpc<"/yadcc.scheduler.AdminService/CordonServant">;
type Drain = Rpc<"/rpc/yadcc.scheduler.AdminService.DrainServant">;
type States = Rpc<"/yadcc.scheduler.AdminService/ListServantStates">;
type Audit = Rpc<"/rpc/yadcc.scheduler.AdminService.ListAuditEvents">;
type Uncordon = Rpc<"/yadcc.scheduler.AdminService/UncordonServant">;

declare const process: { argv: string[]; exit(code: number): never };

const [baseUrl, token] = process.argv.slice(2);

function fail(what: string, detail: unknown): never {
  console.log(`FAIL ${what}: ${JSON.stringify(detail)}`);
  process.exit(1);
}

async function call<Request, Response>(
  path: string,
  request: Request,
  bearer: string | null,
): Promise<{ status: number; body: Response | Schemas["ErrorBody"] }> {
  const headers: Record<string, string> = { "Content-Type": "application/json" };
  if (bearer !== null) headers.Authorization = `Bearer ${bearer}`;
  const answer = await fetch(baseUrl + path, {
    method: "POST",
    headers,
    body: JSON.stringify(request),
  });
  return { status: answer.status, body: (await answer.json()) as Response };
}

async function main(): Promise<void> {
  const location = "127.0.0.8:8335";
  const cordon: Cordon["request"] = { location, reason: "typed client" };
  const cordoned = await call<Cordon["request"], Cordon["response"]>(
    "/yadcc.scheduler.AdminService/CordonServant",
    cordon,
    token,
  );
  const state = (cordoned.body as Cordon["response"]).servant?.state;
  if (cordoned.status !== 200 || state !== "CORDON_STATE_CORDONED") fail("CordonServant", cordoned);

  const drain: Drain["request"] = { location };
  const drained = await call<Drain["request"], Drain["response"]>(
    "/rpc/yadcc.scheduler.AdminService.DrainServant",
    drain,
    token,
  );
  if ((drained.body as Drain["response"]).servant?.state !== "CORDON_STATE_DRAINED") {
    fail("DrainServant", drained);
  }

  const listed = await call<States["request"], States["response"]>(
    "/yadcc.scheduler.AdminService/ListServantStates",
    {},
    token,
  );
  const locations = ((listed.body as States["response"]).servants ?? []).map((s) => s.location);
  if (locations.join() !== location) fail("ListServantStates", listed);

  const uncordon: Uncordon["request"] = { location };
  const uncordoned = await call<Uncordon["request"], Uncordon["response"]>(
    "/yadcc.scheduler.AdminService/UncordonServant",
    uncordon,
    token,
  );
  if ((uncordoned.body as Uncordon["response"]).wasCordoned !== true) {
    fail("UncordonServant", uncordoned);
  }

  const audit = await call<Audit["request"], Audit["response"]>(
    "/rpc/yadcc.scheduler.AdminService.ListAuditEvents",
    {},
    token,
  );
  const actions = ((audit.body as Audit["response"]).events ?? []).map((e) => e.action);
  if (actions.slice(0, 3).join() !== "UncordonServant,DrainServant,CordonServant") {
    fail("ListAuditEvents", audit);
  }

  // Without the token: 401, STATUS_ACCESS_DENIED.
  const refused = await call<Audit["request"], Audit["response"]>(
    "/rpc/yadcc.scheduler.AdminService.ListAuditEvents",
    {},
    null,
  );
  const error = refused.body as Schemas["ErrorBody"];
  if (refused.status !== 401 || error.status !== "STATUS_ACCESS_DENIED") fail("no token", refused);

  console.log("all TypeScript client checks passed");
}

main().catch((error: unknown) => fail("exception", String(error)));
