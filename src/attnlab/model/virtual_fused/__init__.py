"""Virtual heads without the T x T map: the algebra behind ``score.kind = "virtual_heads_fused"``.

A virtual head convolves the attention image over heads and (key, query) offsets,
``s'[h', i, j] = sum_h sum_(a, b) w[h', h, a, b] s[h, i + a, j + b]`` (1-D causal: a = 0 and
b = -t, t < K). Because ``s = q . k`` is bilinear, each piece is ordinary fused attention
(``F.scaled_dot_product_attention``) over rearranged tensors, never forming [B, H, T, T]:

- ``geometry``: the taps, the head groups and the sequence shifts (zero outside the sequence);
- ``keys``: ``on = "logits"`` as attention of stacked shifted queries over convolved keys;
- ``probs``: ``on = "probs"`` as attention over convolved values (bidirectional), plus, for the
  causal form, K - 1 extra keys that carry the near-diagonal probabilities out of the same call;
- ``alibi``: ALiBi's bias as two extra q/k columns, so it is convolved with the keys.
"""
