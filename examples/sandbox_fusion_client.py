"""The `sandbox-fusion` client, unchanged, against Trialbox: it reads SANDBOX_FUSION_ENDPOINT,
which `trialbox local up` (or `trialbox sandbox-fusion-proxy`) prints."""

from sandbox_fusion import RunCodeRequest, run_code

ran = run_code(RunCodeRequest(code="print(input()[::-1])", stdin="trialbox", language="python"))
print(ran.status.value, ran.run_result.stdout.strip())
