-- admit_authz asks Admit's forward-auth endpoint whether HAProxy may
-- forward a request: it sends the request's method, URI and host in
-- X-Original-*, the client's address in X-Forwarded-For and the
-- credentials the client sent, nothing else the client chose: no user
-- (http.user_header) and no shedding class. With authentication in
-- HAProxy, add the user it proved to asked as x-user-id. It sets
-- txn.admit_status (0 when Admit did not answer in time), and the
-- RateLimit headers, Retry-After and problem body to pass on.
local admit = "http://127.0.0.1:8080/v1/authz"

-- first returns a header's first value from HAProxy's header tables,
-- whose values are numbered from 0.
local function first(headers, name)
  local v = headers and headers[name]
  return v and v[0]
end

core.register_action("admit_authz", { "http-req" }, function(txn)
  local asked = {
    ["x-original-method"] = { txn.sf:method() },
    ["x-original-uri"] = { txn.sf:pathq() },
    ["x-original-host"] = { txn.sf:req_fhdr("host") or "" },
    ["x-forwarded-for"] = { txn.sf:src() },
  }
  local sent = txn.http:req_get_headers()
  for _, name in ipairs({ "x-api-key", "authorization" }) do
    local v = first(sent, name)
    if v then asked[name] = { v } end
  end
  local res = core.httpclient():get{ url = admit, headers = asked, timeout = 250 }
  if not res or not res.status then
    txn:set_var("txn.admit_status", 0)
    return
  end
  txn:set_var("txn.admit_status", res.status)
  for var, name in pairs({ admit_ratelimit = "ratelimit", admit_ratelimit_policy = "ratelimit-policy", admit_retry_after = "retry-after" }) do
    local v = first(res.headers, name)
    if v then txn:set_var("txn." .. var, v) end
  end
  txn:set_var("txn.admit_body", ((res.body or ""):gsub("\n$", "")))
end, 0)
