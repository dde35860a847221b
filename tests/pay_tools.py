"""The ``pay`` tool of an agent as people write it, three ways: a ``curl`` child, the
standard library's ``urllib``, a Node ``fetch`` child. Each pays 7 to acct-A at the
effect service whose URL is ``argv[1]`` and prints the receipt (or that it failed).
Shared by the socket tape's and the sealed network's tests."""

PAY = {
    "curl": """
import json, subprocess, sys
body = json.dumps({"amount": 7, "to": "acct-A"})
out = subprocess.run(["curl", "-s", "-X", "POST", "-H", "Content-Type: application/json",
                      "-d", body, sys.argv[1] + "/payments"], capture_output=True, text=True)
print("receipt", out.stdout or out.returncode)
""",
    "urllib": """
import json, sys, urllib.request
req = urllib.request.Request(sys.argv[1] + "/payments", method="POST",
                             data=json.dumps({"amount": 7, "to": "acct-A"}).encode(),
                             headers={"Content-Type": "application/json"})
try:
    print("receipt", urllib.request.urlopen(req, timeout=10).read().decode())
except OSError as e:
    print("failed", type(e).__name__)
""",
    "node": """
import subprocess, sys
js = ("fetch(process.argv[1] + '/payments', {method: 'POST', headers: {'Content-Type': "
      "'application/json'}, body: JSON.stringify({amount: 7, to: 'acct-A'})})"
      ".then(r => r.text()).then(t => console.log(t), e => console.log('failed'))")
out = subprocess.run(["node", "-e", js, sys.argv[1]], capture_output=True, text=True)
print("receipt", out.stdout)
""",
}
