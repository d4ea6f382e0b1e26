"""Model shapes, the training loop (early stopping on held-out loss) and held-out evaluation."""

import copy
import math
import time

import torch
import torch.nn.functional as F
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

import tok

SHAPES = {
    # ~11.0M parameters with vocab 4096 (tied embeddings keep both bf16 folders under 30 MB).
    "target": dict(hidden_size=384, intermediate_size=1024, num_hidden_layers=6,
                   num_attention_heads=6, num_key_value_heads=2, head_dim=64),
    # ~2.4M parameters; same tokenizer and head_dim as the target.
    "draft": dict(hidden_size=192, intermediate_size=512, num_hidden_layers=4,
                  num_attention_heads=3, num_key_value_heads=1, head_dim=64),
    # for CPU checks of the pipeline and of learning dynamics
    "small": dict(hidden_size=128, intermediate_size=384, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=1, head_dim=64),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=2, num_key_value_heads=1, head_dim=32),
}


def make_config(shape, vocab_size, max_pos):
    return LlamaConfig(vocab_size=vocab_size, max_position_embeddings=max_pos,
                       rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
                       bos_token_id=tok.BOS_ID, eos_token_id=tok.EOT_ID, pad_token_id=tok.PAD_ID,
                       initializer_range=0.02, hidden_act="silu", attention_bias=False,
                       mlp_bias=False, **SHAPES[shape])


def new_model(shape, vocab_size, max_pos, seed, device):
    torch.manual_seed(seed)
    cfg = make_config(shape, vocab_size, max_pos)
    model = LlamaForCausalLM(cfg).to(device)
    model.generation_config = GenerationConfig(bos_token_id=tok.BOS_ID, eos_token_id=tok.EOT_ID,
                                               pad_token_id=tok.PAD_ID)
    return model


def n_params(model):
    # tied embeddings are counted once
    return sum(p.numel() for p in model.parameters())


def heldout_batches(docs, device, max_tokens=65536):
    """Right-padded batches of whole held-out documents, sorted by length (deterministic)."""
    order = sorted(range(len(docs)), key=lambda i: len(docs[i][0]))
    batches, cur = [], []
    for i in order:
        if cur and (len(cur) + 1) * len(docs[i][0]) > max_tokens:
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    out = []
    for b in batches:
        L = max(len(docs[i][0]) for i in b)
        ids = torch.full((len(b), L), tok.PAD_ID, dtype=torch.long)
        asst = torch.zeros((len(b), L), dtype=torch.bool)
        mask = torch.zeros((len(b), L), dtype=torch.long)
        for j, i in enumerate(b):
            n = len(docs[i][0])
            ids[j, :n] = torch.from_numpy(docs[i][0].astype("int64"))
            asst[j, :n] = torch.from_numpy(docs[i][1])
            mask[j, :n] = 1
        out.append((ids.to(device), mask.to(device), asst.to(device)))
    return out


@torch.no_grad()
def evaluate(model, batches, other=None, autocast=True):
    """Mean next-token loss over held-out documents; with `other`, also the fraction of
    positions where both models' argmax agree (all positions / positions whose next token is
    in an assistant turn)."""
    model.eval()
    if other is not None:
        other.eval()
    dev = batches[0][0].device
    tot, n = 0.0, 0
    agree = agree_a = n_a = 0
    for ids, mask, asst in batches:
        # bf16 autocast only on the GPU: CPUs without bf16 units emulate it very slowly
        with torch.autocast(dev.type, dtype=torch.bfloat16,
                            enabled=autocast and dev.type == "cuda"):
            logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
            o = (other(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
                 if other is not None else None)
        y = ids[:, 1:]
        valid = mask[:, 1:].bool()
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                             reduction="none").view_as(y)
        tot += ce[valid].sum().item()
        n += valid.sum().item()
        if o is not None:
            same = (logits.argmax(-1) == o.argmax(-1)) & valid
            va = valid & asst[:, 1:]
            agree += same.sum().item()
            agree_a += (same & va).sum().item()
            n_a += va.sum().item()
    model.train()
    res = {"loss": tot / n, "tokens": n}
    if other is not None:
        res["agreement"] = agree / n
        res["agreement_assistant"] = agree_a / n_a
    return res


def train(model, flat, starts, val_batches, *, steps_cap, budget_s, batch, seq, lr, seed,
          eval_every, patience, teacher=None, alpha=0.5, log=print):
    """AdamW + warmup/cosine, bf16 autocast. The schedule length is fixed after timing the
    first steps (min of steps_cap and what fits budget_s); training stops early once the
    held-out loss has not improved for `patience` evaluations, and the best weights are kept.
    With a teacher, the loss is alpha * CE + (1 - alpha) * KL(teacher || student)."""
    dev = next(model.parameters()).device
    data = torch.from_numpy(flat.astype("int64")).to(dev)
    st = torch.from_numpy(starts[starts + seq + 1 <= len(flat)]).to(dev)
    ar = torch.arange(seq + 1, device=dev)
    g = torch.Generator(device=dev)
    g.manual_seed(seed)
    decay = [p for n_, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n_, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95), eps=1e-8,
                            fused=dev.type == "cuda")
    warmup = 100
    total = steps_cap
    timing_at = (10, 60)

    def lr_at(s):
        if s < warmup:
            return lr * (s + 1) / warmup
        frac = min(1.0, (s - warmup) / max(1, total - warmup))
        return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))

    best, best_state, bad = float("inf"), None, 0
    curve = []
    t0 = time.time()
    t_mark = None
    stop_reason = "schedule end"
    s = 0
    model.train()
    while s < total:
        if s == timing_at[0]:
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t_mark = time.time()
        if s == timing_at[1] and t_mark is not None:
            if dev.type == "cuda":
                torch.cuda.synchronize()
            per_step = (time.time() - t_mark) / (timing_at[1] - timing_at[0])
            # eval overhead is small; leave 8% of the budget for it
            fit = int((budget_s * 0.92 - (time.time() - t0)) / per_step) + s
            total = max(timing_at[1] + 1, min(steps_cap, fit))
            log("  {:.1f} ms/step -> schedule of {} steps".format(per_step * 1e3, total))
        for grp in opt.param_groups:
            grp["lr"] = lr_at(s)
        idx = st[torch.randint(len(st), (batch,), generator=g, device=dev)]
        rows = data[idx[:, None] + ar]
        x, y = rows[:, :-1], rows[:, 1:]
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            logits = model(input_ids=x).logits
            if teacher is not None:
                with torch.no_grad():
                    tl = teacher(input_ids=x).logits
        logits = logits.float()
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), y.reshape(-1))
        if teacher is not None:
            kl = F.kl_div(F.log_softmax(logits, -1).view(-1, logits.shape[-1]),
                          F.log_softmax(tl.float(), -1).view(-1, logits.shape[-1]),
                          log_target=True, reduction="batchmean")
            loss = alpha * loss + (1 - alpha) * kl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        s += 1
        if s % eval_every == 0 or s == total:
            ev = evaluate(model, val_batches)["loss"]
            el = time.time() - t0
            curve.append({"step": s, "train_loss": round(loss.item(), 4),
                          "heldout_loss": round(ev, 4), "elapsed_s": round(el, 1)})
            log("  step {:5d}  train {:.4f}  heldout {:.4f}  lr {:.2e}  {:.0f}s".format(
                s, loss.item(), ev, lr_at(s - 1), el))
            if ev < best - 1e-3:
                best, bad = ev, 0
                best_state = copy.deepcopy(model.state_dict())
            else:
                bad += 1
                if bad >= patience:
                    stop_reason = "early stop: no held-out improvement in {} evals".format(
                        patience)
                    break
            if el > budget_s:
                stop_reason = "wall-clock budget"
                break
    if best_state is not None:
        model.load_state_dict(best_state)
    model.eval()
    return {"steps": s, "scheduled_steps": total, "best_heldout_loss_bf16": round(best, 4),
            "stop_reason": stop_reason, "train_seconds": round(time.time() - t0, 1),
            "tokens_seen": s * batch * seq, "curve": curve}


def round_trip_bf16(model):
    """What the engine runs: the bf16 weights that get exported, upcast to float32."""
    m = copy.deepcopy(model).float()
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    m.eval()
    return m
