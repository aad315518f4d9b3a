"""``train``'s help page: its description, the data layout and length notes, and example commands."""

DESCRIPTION = """\
Train a set of ORT training artifacts (training_model.onnx, optimizer_model.onnx, checkpoint;
eval_model.onnx for --eval-data) with ORT's loop: module(*batch) (--grad-accum times), optimizer.step(),
scheduler.step(), module.lazy_reset_grad(). Shows a progress bar (loss, learning rate, step rate,
ETA) and saves an ORT checkpoint with the optimizer state and the data position, from which
--resume continues: at the end, every --save-every steps, and on Ctrl-C (which then prints the
summary and exits with status 130). Step rates exclude the first step (compilation with --compile);
the summary gives the bar's rate (evaluation and saving included) and that of the steps alone, and
says why the run ended."""

DATA_HELP = """\
data layout:
  DATA is an .npz file with one array per user input of the training model (see `inspect`), or a
  Parquet (.parquet), Arrow (.arrow/.feather), CSV (.csv) or JSON-lines (.jsonl) file with one column
  per input (pyarrow: python -m ort_torch_train.install --extra data). Arrays/columns are matched by name, or
  named in the model's input order with --inputs KEY1,KEY2, or by input with --inputs input=KEY,...;
  in a table, KEY may be a pattern (--inputs 'input=px*,labels=label') or a list of columns
  (--inputs features=age,sex,bmi,target=y) stacked on a last axis (a pattern leaves out columns other
  inputs name; -v shows what it caught), a 1-D column fills a [batch, 1] input, and a column of lists
  becomes one more axis. Table columns are cast to the model's dtypes and reshaped
  to its declared dims; .npz dtypes must equal the model's.
  Axis 0 indexes samples: each micro-batch feeds --batch-size rows (shuffled each epoch unless
  --no-shuffle; a last partial batch is dropped), read by a DataLoader with --workers processes.
  With --batched (.npz), axis 0 indexes ready-made batches ([steps, batch, ...], batch i is x[i]).
  --eval-data works the same way against the eval model's inputs (--eval-inputs, default --inputs),
  evaluated in chunks of --batch-size.

length and resume:
  --max-steps N trains until the optimizer's step count (kept in the checkpoint) is N: repeating
  the same command with --resume finishes the same run. --steps N trains N more steps from the
  checkpoint's count; --epochs N makes N more passes over the data. A resumed run continues the
  data order where it stopped (seed, epoch and position are in the checkpoint).

learning rate:
  --lr (default: the checkpoint's initial learning rate, 0.001 for fresh artifacts) with
  --schedule constant|linear|cosine and --warmup steps; linear and cosine decay to 0 at
  --total-steps (default: --max-steps, or the step count this run ends at)."""

EXAMPLES = """\
examples:
  ort-torch-train train artifacts/ --data train.npz --epochs 3 --batch-size 32 --output run/ckpt
  ort-torch-train train artifacts/ --data train.parquet --inputs 'input=pixels,labels=label' \\
      --max-steps 500 --grad-accum 4 --eval-data test.parquet --eval-every 50 --metric accuracy \\
      --save-every 100 --keep-last 2 --save-best accuracy --early-stop 5 --output run/ckpt
  ort-torch-train train artifacts/ --data train.parquet --max-steps 500 --resume run/ckpt --output run/ckpt
  torchrun --nproc_per_node=2 -m ort_torch_train train artifacts/ --data train.npz --batch-size 64 \\
      --max-steps 500 --shard-state --output run/ckpt      (data-parallel: each rank feeds 32 of the 64 rows)
  ort-torch-train train refcorpus/cnn/artifacts --data refcorpus/cnn/data.npz --inputs x_train,y_train \\
      --batched --steps 20 --eval-data refcorpus/cnn/data.npz --eval-inputs x_eval,y_eval"""
