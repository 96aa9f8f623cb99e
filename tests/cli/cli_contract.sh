#!/usr/bin/env bash
# The CLI contract of the README: JSON shape, --set, stdin, exit codes, one-line errors naming the field.
set -u
cli="${MEMSIM_CLI:?set MEMSIM_CLI to the memsim-cli binary}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
fails=0
check() {  # check NAME CONDITION...
  local name="$1"; shift
  if "$@"; then echo "ok   $name"; else echo "FAIL $name"; fails=$((fails + 1)); fi
}
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT

"$cli" config > "$tmp/default.json"; check "config prints the default config" test -s "$tmp/default.json"
"$cli" estimate --config "$tmp/default.json" --format json > "$tmp/out.json"; rc=$?
check "estimate exits 0" test $rc -eq 0
py() { python3 -c "import json,sys; d=json.load(open('$tmp/out.json')); $1"; }
check "schema is an integer" py "assert isinstance(d['schema'], int)"
check "params_total of the default (13,015,864,320)" py "assert d['params_total'] == 13015864320"
check "devices have peak, breakdown and fits" py "
dev = d['devices'][0]
assert set(['allocated_bytes','reserved_bytes','device_bytes']) <= set(dev['peak'])
assert isinstance(dev['fits'], bool)
assert sum(dev['breakdown'].values()) == dev['peak']['device_bytes']"

check "devices have a verdict and a band of every statistic around the prediction" py "
dev = d['devices'][0]
assert dev['verdict'] in ('fits', 'borderline', 'does_not_fit', 'out_of_memory')
assert dev['verdict'] != 'fits' or dev['fits']
b = dev['band']
assert set(b) == {'allocated', 'reserved', 'active', 'device'}
for k in b: assert b[k]['low_bytes'] <= dev['peak'][k + '_bytes'] <= b[k]['high_bytes']
assert (dev['verdict'] == 'fits') == (b['device']['high_bytes'] <= dev['usable_bytes'] and not dev['oom'])"

"$cli" estimate --config - --set model.hidden_size=4096 --set model.intermediate_size=11008 \
  --set model.num_hidden_layers=32 --set model.num_attention_heads=32 --set model.num_key_value_heads=32 \
  < "$tmp/default.json" > "$tmp/out.json"
check "stdin and --set (Llama-2-7B shape: 6,738,415,616)" py "assert d['params_total'] == 6738415616"

"$cli" estimate --hf-config "$here/tests/data/hf/llama-3-8b.json" > "$tmp/out.json" 2>/dev/null
check "--hf-config (Llama-3-8B: 8,030,261,248)" py "assert d['params_total'] == 8030261248"

"$cli" estimate --hf-config "$here/tests/data/hf/t5-base.json" --set training.decoder_sequence_length=128 > "$tmp/out.json" 2>/dev/null
check "--hf-config of an encoder-decoder (t5-base: 222,903,552)" py "assert d['params_total'] == 222903552"

"$cli" estimate --preset llama-3.1-8b --set training.framework=unsloth --set versions.unsloth=2024.8 \
  --set parallel.zero_stage=0 --set parallel.data_parallel_size=1 --set peft.method=lora --set peft.base_quantization=nf4 \
  --set peft.prepare_kbit=false --set training.activation_checkpointing=full --set training.activation_offload=true \
  > "$tmp/out.json" 2>/dev/null
check "Unsloth: its loss and checkpointing named in the notes, from its version" py "
n = ' '.join(d['notes']); assert 'unsloth_logits, from unsloth 2024.8.0' in n and 'Unsloth_Offloaded_Gradient_Checkpointer' in n"
"$cli" estimate --preset llama-3.1-8b --set training.framework=unsloth > "$tmp/out.json" 2> "$tmp/err.txt"; rc=$?
check "Unsloth under ZeRO-3 is refused with the field named" sh -c "test $rc -ne 0 && grep -q 'training.framework unsloth trains on one GPU' '$tmp/err.txt'"

"$cli" estimate --config "$tmp/default.json" --timeline > "$tmp/out.json"
check "--timeline adds the timeline" py "t = d['devices'][0]['timeline']; assert len(t['allocated_bytes']) > 0 and len(t['phases']) > 0"

"$cli" estimate --config "$tmp/default.json" --format table > "$tmp/table.txt"
check "--format table" grep -q "peak allocated" "$tmp/table.txt"

# --suggest: every suggestion's --set settings, applied to the same config, give the peak it promises.
"$cli" estimate --config "$tmp/default.json" --set training.activation_checkpointing=none --suggest > "$tmp/out.json"
check "--suggest adds ranked suggestions with their settings" py "
s = d['suggestions']
assert len(s) > 0 and all(x['saved_bytes'] > 0 and x['set'] for x in s)
order = ['same_job', 'same_job_numerics', 'pair', 'more_hardware', 'changes_job']
assert [order.index(x['group']) for x in s] == sorted(order.index(x['group']) for x in s)
assert all(a['saved_bytes'] >= b['saved_bytes'] for a, b in zip(s, s[1:]) if a['group'] == b['group'] and not a['fits'] and not b['fits'])
assert any(x['set'] == ['training.activation_checkpointing=full'] for x in s)
assert all(x['verdict'] in ('fits', 'borderline', 'does_not_fit', 'out_of_memory') and x['fits'] == (x['verdict'] == 'fits') for x in s)"
sets=$(python3 -c "import json; s = json.load(open('$tmp/out.json'))['suggestions'][0]; print(' '.join('--set ' + x for x in s['set']))")
want=$(python3 -c "import json; print(json.load(open('$tmp/out.json'))['suggestions'][0]['device_bytes_after'])")
# shellcheck disable=SC2086
"$cli" estimate --config "$tmp/default.json" --set training.activation_checkpointing=none $sets > "$tmp/applied.json"
check "--suggest: the first suggestion's settings reproduce its peak" python3 -c "
import json; d = json.load(open('$tmp/applied.json'))
assert max(x['peak']['device_bytes'] for x in d['devices']) == $want"
"$cli" estimate --config "$tmp/default.json" --format table --suggest > "$tmp/table.txt"
check "--suggest in the table" grep -q "what helps" "$tmp/table.txt"
check "the table prints the band and the headroom it asks for" grep -q "keep .* of the GPU free above the prediction" "$tmp/table.txt"

# Every published case replayed whole, each run of varying lengths in every order of its data: about 25 s natively,
# several times that under ASan, where the sanitizers' unit tests already run every case (cut short) through the same
# code; scripts/sanitize.sh sets MEMSIM_CONTRACT_SKIP_VALIDATE for its run of this contract.
if [ -z "${MEMSIM_CONTRACT_SKIP_VALIDATE:-}" ]; then
  "$cli" validate "$here/tests/validation/cases" --residuals "$tmp/residuals.tsv" > "$tmp/validation.md"
  check "validate --residuals writes the band's table, as the build embeds it" cmp -s "$tmp/residuals.tsv" "$here/src/core/catalog/residuals.tsv"
fi

"$cli" config --accelerate-config "$here/tests/data/accelerate/fsdp1_hybrid_2x8.yaml" > "$tmp/acc.json" 2>/dev/null
check "--accelerate-config (FSDP1 HYBRID_SHARD on 2 x 8 GPUs)" python3 -c "
import json; p = json.load(open('$tmp/acc.json'))['parallel']
assert (p['sharding'], p['zero_stage'], p['shard_group_size'], p['data_parallel_size']) == ('fsdp1', 3, 8, 16)"
"$cli" estimate --accelerate-config - < "$here/tests/data/accelerate/fsdp2_no_reshard.yaml" > "$tmp/out.json" 2>/dev/null
check "--accelerate-config - (stdin) estimates" py "assert d['devices'][0]['peak']['device_bytes'] > 0"

# --lengths-file: a file of per-sample token lengths becomes the data section's distribution and dataset size, and
# the run is replayed; what it set is noted on stderr.
python3 -c "
import random; random.seed(5)
print('\n'.join(str(max(8, int(random.lognormvariate(5.3, 0.6)))) for _ in range(3000)))" > "$tmp/lengths.txt"
"$cli" config --preset llama-3.2-1b --lengths-file "$tmp/lengths.txt" > "$tmp/run.json" 2> "$tmp/note.txt"
check "--lengths-file sets data.lengths, sample_lengths (exact ends) and dataset_samples" python3 -c "
import json; d = json.load(open('$tmp/run.json'))['data']
lengths = [int(x) for x in open('$tmp/lengths.txt')]
assert d['lengths'] == 'samples' and d['dataset_samples'] == 3000, d
parts = d['sample_lengths'].split(',')
assert parts[0] == 'p0=%d' % min(lengths) and parts[-1] == 'p100=%d' % max(lengths), d['sample_lengths']
assert len(parts) > 20 and len(d['sample_lengths']) < 2048"
check "--lengths-file notes on stderr what it set" grep -q "lengths-file read 3000 sample lengths.*data.dataset_samples=3000" "$tmp/note.txt"
printf '[300, 1200, 80, 950]' | "$cli" estimate --preset llama-3.2-1b --set parallel.zero_stage=0 --set parallel.data_parallel_size=1 \
  --lengths-file - --set data.steps=20 > "$tmp/out.json" 2>/dev/null
check "--lengths-file - (a JSON array on stdin) replays the run" py "
run = d['devices'][0]['run']
assert run['steps'] == 20 and run['longest_tokens'] == 1200, run"
"$cli" estimate --preset llama-3.2-1b --set parallel.zero_stage=0 --set parallel.data_parallel_size=1 \
  --lengths-file "$tmp/lengths.txt" --set data.steps=30 --format table > "$tmp/table.txt" 2>/dev/null
check "the table says where in the run the peak is" grep -Eq "^  run: peak at step [0-9]+ of 30, .*reserved" "$tmp/table.txt"

# --link: a link of the page (a whole URL, or its fragment) opens as the page opens it; what chat clients append to a
# link is ignored; --set applies after it.
"$cli" config --set training.micro_batch_size=2 --set hardware.gpu=h100-sxm --format fragment > "$tmp/link.txt"
link="$(cat "$tmp/link.txt")"
check "config --format fragment writes the short link" grep -Eq '^memsim=3&micro_batch_size=2&gpu=h100-sxm&c=[0-9a-z]{6}$' "$tmp/link.txt"
"$cli" config --link "https://example.org/memsim/#$link)." > "$tmp/linked.json"
"$cli" config --set training.micro_batch_size=2 --set hardware.gpu=h100-sxm > "$tmp/set.json"
check "config --link of a whole URL (with a chat client's ').') gives the config the link was made of" cmp -s "$tmp/linked.json" "$tmp/set.json"
"$cli" estimate --link "$link" --set micro_batch_size=1 > "$tmp/out.json"
check "estimate --link, then --set with a bare name" py "assert d['devices'][0]['peak']['device_bytes'] > 0"
"$cli" config --link "$(cat "$here/tests/golden/v2.fragment")" > "$tmp/golden.json"
"$cli" config --config "$here/tests/golden/v2.expected.json" > "$tmp/expected.json"
check "config --link of a full schema-2 link (no checksum) opens it" cmp -s "$tmp/golden.json" "$tmp/expected.json"

err_case() {  # err_case NAME FIELD ARGS...
  local name="$1" field="$2"; shift 2
  "$cli" "$@" > /dev/null 2> "$tmp/err.txt" < /dev/null; local rc=$?
  check "$name: exit 2" test $rc -eq 2
  check "$name: one line naming $field" bash -c "[ \$(wc -l < '$tmp/err.txt') -eq 1 ] && grep -q '$field' '$tmp/err.txt'"
}
err_case "negative layers" model.num_hidden_layers estimate --config "$tmp/default.json" --set model.num_hidden_layers=-3
err_case "non-numeric batch" training.micro_batch_size estimate --config "$tmp/default.json" --set training.micro_batch_size=four
err_case "heads not dividing hidden" model.num_attention_heads estimate --config "$tmp/default.json" --set model.head_dim=0 --set model.num_attention_heads=7 --set model.num_key_value_heads=7
err_case "T5 with tensor parallelism" parallel.tensor_parallel_size estimate --preset t5-3b --set parallel.tensor_parallel_size=2
err_case "absurd layers" model.num_hidden_layers estimate --config "$tmp/default.json" --set model.num_hidden_layers=1000000000000000
echo '{"training": {"micro_batch_size": "x"}}' > "$tmp/bad.json"
err_case "bad type in file" training.micro_batch_size estimate --config "$tmp/bad.json"
echo '{"model": ' > "$tmp/broken.json"
err_case "broken JSON" "not valid JSON" estimate --config "$tmp/broken.json"
err_case "unknown key" "unknown key" estimate --set model.nope=1
printf 'distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 3\n' > "$tmp/acc.yaml"
err_case "bad Accelerate config" fsdp_config.fsdp_version estimate --accelerate-config "$tmp/acc.yaml"
err_case "a value with a newline and an ESC sequence" model.hidden_size estimate --set $'model.hidden_size=1\n2\x1b[31m'
check "the escape sequence is written escaped" grep -qF '\x1b[31m' "$tmp/err.txt"
err_case "no arguments at all" "usage" 
err_case "no link for an invalid config" model.hidden_size config --set model.hidden_size=-5 --format fragment
err_case "an endless file is refused after 8 MiB" "larger than 8 MiB" estimate --config /dev/zero
err_case "a pipeline of too many micro-batches" training.gradient_accumulation_steps estimate --set training.framework=torchtitan \
  --set parallel.pipeline_parallel_size=16 --set training.gradient_accumulation_steps=1048576 --set model.num_hidden_layers=16
printf '120\n-4\n' > "$tmp/negative.txt"
err_case "negative length in a lengths file" data.sample_lengths estimate --lengths-file "$tmp/negative.txt"
printf '[120, NaN]' > "$tmp/nan.json"
err_case "NaN in a lengths file" data.sample_lengths config --lengths-file "$tmp/nan.json"
printf 'distributed_type: &a FSDP\n' > "$tmp/anchor.yaml"
err_case "YAML anchor in an Accelerate config" "anchors" config --accelerate-config "$tmp/anchor.yaml"

"$cli" keys > "$tmp/keys.txt"; "$cli" keys --long > "$tmp/keys_long.txt"
check "keys --long: one line per key, with its type, allowed values, default and help" python3 -c "
keys = open('$tmp/keys.txt').read().split()
rows = [l.split('\t') for l in open('$tmp/keys_long.txt').read().splitlines()]
assert [r[0] for r in rows] == keys and all(len(r) == 5 and r[4] for r in rows)
hs = [r for r in rows if r[0] == 'model.hidden_size'][0]
assert hs[1:4] == ['integer', '1 to 1048576', '5120'], hs"
err_case "keys with an unknown option" "keys takes --long" keys --wide
"$cli" schema > "$tmp/schema.json"
check "schema prints the config's JSON Schema, as docs/config.schema.json holds it" cmp -s "$tmp/schema.json" "$here/docs/config.schema.json"

err_case "a link cut off at a field boundary" "cut off in chat" estimate --link "https://example.org/memsim/#${link%&c=*}"
err_case "an altered link" "checksum mismatch" config --link "${link/micro_batch_size=2/micro_batch_size=4}"

echo "cli_contract: $fails failed"
[ $fails -eq 0 ]
