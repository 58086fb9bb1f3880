"""Step 1: one process trains on every row. Each later lesson must reproduce what this one computes.

    python docs/lessons/code/baseline.py
    torchrun --nproc_per_node 2 docs/lessons/code/baseline.py    # Try it: two processes, nothing shared
"""

import os

import torch
from torch import nn

torch.manual_seed(0)
X = torch.randn(64, 16)  # 64 rows of 16 features
y = (X @ torch.randn(16, 4)).argmax(1)  # 4 classes, assigned by a random linear "teacher"
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
batch_size, epochs = 16, 3

# torchrun sets RANK and WORLD_SIZE; a plain `python` run has neither.
me = f"process {os.environ.get('RANK', 0)} of {os.environ.get('WORLD_SIZE', 1)}"
steps, rows = 0, 0
for epoch in range(epochs):
    for i in range(0, len(X), batch_size):  # batches of 16 rows, in order
        xb, yb = X[i : i + batch_size], y[i : i + batch_size]
        loss = nn.functional.cross_entropy(model(xb), yb)
        optimizer.zero_grad()
        loss.backward()  # the gradient of this batch's mean loss
        optimizer.step()  # w -= lr * grad
        steps, rows = steps + 1, rows + len(xb)
    with torch.no_grad():
        full = nn.functional.cross_entropy(model(X), y).item()
    print(f"{me}: epoch {epoch}: loss on all 64 rows {full:.4f}")

checksum = sum(p.double().sum().item() for p in model.parameters())
print(f"{me}: {steps} steps, {rows} rows processed, weight checksum {checksum:.6f}")
