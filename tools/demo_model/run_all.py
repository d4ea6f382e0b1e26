"""Whole demo-model pipeline: corpus -> tokenizer -> target -> draft -> export -> report/goldens.

    python3 run_all.py --out DIR            # full run (one H200: about 4 minutes)
    python3 run_all.py --out DIR --tiny     # CPU smoke test of every stage

DIR receives models/demo-chat/, models/demo-chat-draft/, tests/fixtures/demo_golden.json,
report.json, and demo_models.tar.gz (split into 15 MiB parts when larger) holding all of it.
"""

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import time

import numpy as np
import torch

import corpus
import data
import golden
import tok
import train

SEED = 20261202


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--tiny", action="store_true",
                    help="small defaults for every option below, for a CPU check")
    ap.add_argument("--n-train", type=int, help="training records (default 80000)")
    ap.add_argument("--n-heldout", type=int, help="held-out records (default 2000)")
    ap.add_argument("--vocab", type=int, help="default 4096")
    ap.add_argument("--seq", type=int, help="training window, default 1024")
    ap.add_argument("--batch", type=int, help="default 64")
    ap.add_argument("--target-budget", type=float, help="seconds, default 140")
    ap.add_argument("--draft-budget", type=float, help="seconds per variant, default 45")
    ap.add_argument("--target-steps", type=int, help="cap on the schedule, default 6000")
    ap.add_argument("--draft-steps", type=int, help="cap on the schedule, default 5000")
    ap.add_argument("--eval-every", type=int, help="default 200")
    ap.add_argument("--shapes", help="target,draft keys of train.SHAPES; default target,draft")
    args = ap.parse_args()
    full = dict(n_train=80000, n_heldout=2000, vocab=4096, seq=1024, batch=64,
                target_budget=140.0, draft_budget=45.0, target_steps=6000, draft_steps=5000,
                eval_every=200, shapes="target,draft")
    tiny = dict(full, n_train=3000, n_heldout=200, vocab=1024, seq=128, batch=8,
                target_budget=600.0, draft_budget=600.0, target_steps=60, draft_steps=60,
                eval_every=10, shapes="tiny,tiny")
    for k, v in (tiny if args.tiny else full).items():
        if getattr(args, k) is None:
            setattr(args, k, v)

    t_start = time.time()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type == "cpu":
        torch.set_num_threads(1)  # the CPU check shares its machine with builds
    shapes = tuple(args.shapes.split(","))
    out = os.path.abspath(args.out)
    work = os.path.join(out, "work")
    tgt_dir = os.path.join(out, "models", "demo-chat")
    dft_dir = os.path.join(out, "models", "demo-chat-draft")
    fix_path = os.path.join(out, "tests", "fixtures", "demo_golden.json")
    for d in (work, os.path.dirname(fix_path)):
        os.makedirs(d, exist_ok=True)
    report = {"date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(
        timespec="seconds"), "command": " ".join(sys.argv), "seed": SEED,
        "options": vars(args)}
    report["env"] = env_info(dev)
    log("env: " + json.dumps(report["env"]))

    def stage(name):
        log("== {} ({:.0f}s)".format(name, time.time() - t_start))

    try:
        # ------------------------------------------------------------ corpus + tokenizer
        stage("corpus")
        train_recs = corpus.generate(SEED, args.n_train)
        held_recs = corpus.generate(SEED + 1, args.n_heldout)
        stage("tokenizer")
        tk = tok.train_tokenizer(iter_texts(train_recs), args.vocab)
        tok.save_tokenizer(tk, os.path.join(work, "tokenizer"), args.seq)
        train_docs = data.encode_records(tk, train_recs)
        held_docs = data.encode_records(tk, held_recs)
        data.check_encoding(tk, train_recs, train_docs)
        data.check_encoding(tk, held_recs, held_docs)
        flat, starts = data.pack(train_docs)
        n_held = int(sum(len(d[0]) for d in held_docs))
        n_chars = sum(len(data.record_text(r)) for r in train_recs)
        report["corpus"] = {
            "train_records": len(train_recs), "heldout_records": len(held_recs),
            "train_articles": sum("text" in r for r in train_recs),
            "train_tokens": int(len(flat)), "heldout_tokens": n_held,
            "train_chars": n_chars, "chars_per_token": round(n_chars / len(flat), 3),
            "assistant_token_fraction": round(float(np.mean(np.concatenate(
                [d[1] for d in train_docs]))), 3),
            "vocab_size": tk.get_vocab_size(),
            "max_doc_tokens": int(max(len(d[0]) for d in train_docs)),
            "mean_doc_tokens": round(len(flat) / len(train_docs), 1),
        }
        log("corpus: " + json.dumps(report["corpus"]))
        with open(os.path.join(work, "sample_conversations.txt"), "w") as f:
            for r in train_recs[:30]:
                f.write(data.record_text(r) + "\n\n")
        val = train.heldout_batches(held_docs[: min(800, len(held_docs))], dev)
        val_full = train.heldout_batches(held_docs, dev)
        V = tk.get_vocab_size()

        # ------------------------------------------------------------ target
        stage("target")
        target = train.new_model(shapes[0], V, args.seq, SEED, dev)
        report["target"] = {"params": train.n_params(target), "shape": train.SHAPES[shapes[0]]}
        log("target params: {}".format(report["target"]["params"]))
        report["target"]["training"] = train.train(
            target, flat, starts, val, steps_cap=args.target_steps,
            budget_s=args.target_budget, batch=args.batch, seq=args.seq, lr=2e-3,
            seed=SEED, eval_every=args.eval_every, patience=4, log=log)
        export(target, tk, tgt_dir, work)
        target_rt = train.round_trip_bf16(target)

        # ------------------------------------------------------------ drafts: CE vs distilled
        drafts = {}
        for variant in ("distilled", "ce"):
            stage("draft " + variant)
            m = train.new_model(shapes[1], V, args.seq, SEED + 7, dev)
            info = {"params": train.n_params(m), "shape": train.SHAPES[shapes[1]]}
            info["training"] = train.train(
                m, flat, starts, val, steps_cap=args.draft_steps, budget_s=args.draft_budget,
                batch=args.batch, seq=args.seq, lr=3e-3, seed=SEED + 7,
                eval_every=args.eval_every, patience=4,
                teacher=target if variant == "distilled" else None, log=log)
            m_rt = train.round_trip_bf16(m)
            ev = train.evaluate(m_rt, val_full, other=target_rt, autocast=False)
            info["heldout_f32"] = ev
            log("draft {}: {}".format(variant, json.dumps(ev)))
            drafts[variant] = (m, info)
            del m_rt
        chosen = max(drafts, key=lambda k: drafts[k][1]["heldout_f32"]["agreement"])
        draft, dinfo = drafts[chosen]
        report["draft"] = dinfo
        report["draft"]["variant"] = chosen
        report["draft_variants"] = {k: {"heldout_f32": v[1]["heldout_f32"],
                                        "train": {x: v[1]["training"][x] for x in
                                                  ("steps", "stop_reason", "train_seconds")}}
                                    for k, v in drafts.items()}
        export(draft, tk, dft_dir, work)
        del drafts

        # ------------------------------------------------------------ final held-out figures
        stage("evaluate exported models (float32)")
        # sdpa for the batched evaluation; eager (goldens) differs only by rounding
        t32 = golden.load_f32(tgt_dir, dev, attn="sdpa")
        d32 = golden.load_f32(dft_dir, dev, attn="sdpa")
        et = train.evaluate(t32, val_full, autocast=False)
        ed = train.evaluate(d32, val_full, other=t32, autocast=False)
        report["target"]["heldout"] = {"loss": round(et["loss"], 4),
                                       "perplexity": round(float(np.exp(et["loss"])), 3),
                                       "tokens": et["tokens"]}
        report["draft"]["heldout"] = {"loss": round(ed["loss"], 4),
                                      "perplexity": round(float(np.exp(ed["loss"])), 3),
                                      "tokens": ed["tokens"]}
        report["draft_agreement"] = {"all_positions": round(ed["agreement"], 4),
                                     "assistant_positions": round(ed["agreement_assistant"], 4)}
        log("final: " + json.dumps({k: report[k] for k in ("draft_agreement",)}) +
            " target " + json.dumps(report["target"]["heldout"]) +
            " draft " + json.dumps(report["draft"]["heldout"]))
        del t32, d32

        # ------------------------------------------------------------ end-of-turn check
        stage("end-of-turn check")
        tokz = golden.tokenizer_for(tgt_dir)
        questions = heldout_questions(held_recs, 20)
        eot_t = golden.end_of_turn_check(tgt_dir, tokz, questions, dev)
        eot_d = golden.end_of_turn_check(dft_dir, tokz, questions, dev)
        report["end_of_turn"] = {
            "target_ended_within_128": sum(x["ended_turn"] for x in eot_t),
            "draft_ended_within_128": sum(x["ended_turn"] for x in eot_d),
            "n_questions": len(questions),
            "target_replies": eot_t, "draft_replies": eot_d}
        log("end of turn: target {}/{}  draft {}/{}".format(
            report["end_of_turn"]["target_ended_within_128"], len(questions),
            report["end_of_turn"]["draft_ended_within_128"], len(questions)))
        for x in eot_t[:6]:
            log("  Q: {}\n  A: {}".format(x["messages"][-1]["content"], x["reply"]))

        # ------------------------------------------------------------ goldens (CPU, float32)
        stage("goldens")
        if dev.type == "cuda":
            torch.set_num_threads(min(8, os.cpu_count() or 1))
        fixture = {
            "model": "models/demo-chat",
            "format": "see tools/demo_model/README.md",
            "generated_by": {"transformers": report["env"]["transformers"],
                             "torch": report["env"]["torch"], "device": "cpu",
                             "dtype": "float32 (exported bf16 weights upcast)",
                             "attention": "eager", "decoding": "greedy",
                             "max_new_tokens": golden.MAX_NEW},
            "bos_token_id": tok.BOS_ID, "eos_token_id": tok.EOT_ID, "pad_token_id": tok.PAD_ID,
            "cases": golden.golden_cases(tgt_dir, tokz),
            "draft": {"model": "models/demo-chat-draft",
                      "cases": golden.golden_cases(dft_dir, tokz)},
        }
        with open(fix_path, "w") as f:
            json.dump(fixture, f, indent=1)
            f.write("\n")
        for c in fixture["cases"]:
            log("  golden {:18s} eos={} gap={:.3f} {!r}".format(
                c["name"], c["stopped_on_eos"], c["min_top2_logit_gap"], c["output_text"]))
        report["golden_min_gap"] = {
            "target": min(c["min_top2_logit_gap"] for c in fixture["cases"]),
            "draft": min(c["min_top2_logit_gap"] for c in fixture["draft"]["cases"])}
    finally:
        report["total_seconds"] = round(time.time() - t_start, 1)
        report["model_bytes"] = folder_sizes(out)
        with open(os.path.join(out, "report.json"), "w") as f:
            json.dump(report, f, indent=1)
        package(out)
        log("done in {:.0f}s".format(time.time() - t_start))


def iter_texts(records):
    for r in records:
        if "messages" in r:
            for m in r["messages"]:
                yield m["content"]
        else:
            yield r["text"]


def heldout_questions(records, n):
    """[system, first user message] from the first n held-out chats."""
    qs = []
    for r in records:
        if "messages" not in r:
            continue
        msgs = r["messages"]
        first_user = next(m for m in msgs if m["role"] == "user")
        qs.append([msgs[0], first_user] if msgs[0]["role"] == "system" else [first_user])
        if len(qs) == n:
            break
    return qs


def export(model, tk, folder, work):
    """bf16 safetensors + config + generation_config + tokenizer files."""
    if os.path.exists(folder):
        shutil.rmtree(folder)
    m = train.round_trip_bf16(model).to("cpu").to(torch.bfloat16)
    m.save_pretrained(folder, safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(work, "tokenizer", f), os.path.join(folder, f))
    log("exported {}: {}".format(folder, sorted(os.listdir(folder))))


def folder_sizes(out):
    sizes = {}
    for sub in ("models/demo-chat", "models/demo-chat-draft"):
        p = os.path.join(out, sub)
        if os.path.isdir(p):
            sizes[sub] = {f: os.path.getsize(os.path.join(p, f)) for f in sorted(os.listdir(p))}
    return sizes


def package(out):
    """One tar.gz of everything the repository needs, split to fit the 16 MiB file limit."""
    tar_path = os.path.join(out, "demo_models.tar.gz")
    with tarfile.open(tar_path, "w:gz") as t:
        for p in ("models", "tests", "report.json", "work/sample_conversations.txt"):
            if os.path.exists(os.path.join(out, p)):
                t.add(os.path.join(out, p), arcname=p)
    size, part = os.path.getsize(tar_path), 15 * 1024 * 1024
    if size > part:
        with open(tar_path, "rb") as f:
            i = 0
            while True:
                chunk = f.read(part)
                if not chunk:
                    break
                with open("{}.part{}".format(tar_path, i), "wb") as g:
                    g.write(chunk)
                i += 1
        os.remove(tar_path)
    # only the packaged files (and the small report/log) travel back
    shutil.rmtree(os.path.join(out, "work"), ignore_errors=True)
    shutil.rmtree(os.path.join(out, "models"), ignore_errors=True)


def env_info(dev):
    import tokenizers
    import transformers
    info = {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
            "device": str(dev), "cpu_count": os.cpu_count()}
    if dev.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(0)
    try:
        info["git_rev"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"],
                                         capture_output=True, text=True).stdout.strip()
    except OSError:
        pass
    return info


def log(msg):
    print(msg, flush=True)


if __name__ == "__main__":
    main()
