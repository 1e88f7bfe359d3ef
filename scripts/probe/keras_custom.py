"""Keras models written the way users write them, for the probe (``"lib": "keras_custom"``).

Each builder returns an uncompiled ``keras.Model`` with seeded random weights: functional
models with several inputs and outputs, integer token inputs, recurrent and attention
layers, transposed convolutions, the preprocessing layers apps keep inside the model, and
the less common activations. scripts/probe/convert_keras.py converts them with the TFLite
converter (float, or full-integer int8 for the single-image ones).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def text_classifier(keras: Any) -> Any:
    """Token ids -> embedding + learned positions -> one transformer block
    (MultiHeadAttention, LayerNormalization, a ReLU feed-forward) -> average -> softmax."""
    L = keras.layers
    ids = keras.Input((64,), batch_size=1, dtype="int32", name="ids")
    x = L.Embedding(2000, 64)(ids)
    pos = L.Embedding(64, 64)(keras.ops.arange(64)[None])
    x = x + pos
    a = L.MultiHeadAttention(num_heads=4, key_dim=16)(x, x)
    x = L.LayerNormalization(epsilon=1e-6)(x + a)
    f = L.Dense(128, activation="relu")(x)
    x = L.LayerNormalization(epsilon=1e-6)(x + L.Dense(64)(f))
    x = L.GlobalAveragePooling1D()(x)
    return keras.Model(ids, L.Dense(5, activation="softmax")(x))


def keyword_spotter(keras: Any) -> Any:
    """MFCC frames [98, 40] -> Conv1D, BatchNorm, ReLU, MaxPooling1D, SeparableConv1D,
    dilated Conv1D, GlobalMaxPooling1D, Dense softmax (a keyword-spotting net)."""
    L = keras.layers
    x0 = keras.Input((98, 40), batch_size=1, name="mfcc")
    x = L.Conv1D(64, 5, padding="same")(x0)
    x = L.ReLU()(L.BatchNormalization()(x))
    x = L.MaxPooling1D(2)(x)
    x = L.SeparableConv1D(64, 5, padding="same", activation="relu")(x)
    x = L.Conv1D(64, 3, dilation_rate=2, padding="causal", activation="swish")(x)
    x = L.GlobalMaxPooling1D()(x)
    return keras.Model(x0, L.Dense(12, activation="softmax")(x))


def conv_autoencoder(keras: Any) -> Any:
    """64x64 RGB -> strided convs down -> Conv2DTranspose and bilinear UpSampling2D up with
    skip concatenations, ZeroPadding2D and Cropping2D -> sigmoid (a denoising U-Net)."""
    L = keras.layers
    x0 = keras.Input((64, 64, 3), batch_size=1, name="image")
    a = L.Conv2D(16, 3, padding="same", activation="relu")(x0)
    b = L.Conv2D(32, 3, strides=2, padding="same", activation="relu")(a)
    c = L.Conv2D(64, 3, strides=2, padding="same", activation="elu")(b)
    u = L.Conv2DTranspose(32, 3, strides=2, padding="same", activation="relu")(c)
    u = L.Concatenate()([u, b])
    u = L.UpSampling2D(2, interpolation="bilinear")(u)
    u = L.Cropping2D(1)(L.ZeroPadding2D(1)(u))
    u = L.Conv2D(16, 3, padding="same", activation="relu")(L.Concatenate()([u, a]))
    return keras.Model(x0, L.Conv2D(3, 1, activation="sigmoid")(u))


def bilstm_tagger(keras: Any) -> Any:
    """Features [20, 16] -> Bidirectional LSTM (sequences) -> TimeDistributed Dense softmax."""
    L = keras.layers
    x0 = keras.Input((20, 16), batch_size=1, name="frames")
    x = L.Bidirectional(L.LSTM(32, return_sequences=True))(x0)
    return keras.Model(x0, L.TimeDistributed(L.Dense(8, activation="softmax"))(x))


def small_cnn(keras: Any) -> Any:
    """A 28x28 digit classifier: Conv2D, MaxPooling2D, Dropout, Flatten, Dense."""
    L = keras.layers
    x0 = keras.Input((28, 28, 1), batch_size=1, name="digit")
    x = L.Conv2D(32, 3, activation="relu")(x0)
    x = L.MaxPooling2D()(L.Conv2D(64, 3, activation="relu")(x))
    x = L.Flatten()(L.Dropout(0.25)(x))
    x = L.Dense(128, activation="relu")(x)
    return keras.Model(x0, L.Dense(10, activation="softmax")(L.Dropout(0.5)(x)))


def two_tower(keras: Any) -> Any:
    """Two inputs (an image and tabular features) and two outputs (a score and class
    probabilities): a CNN tower, a dense tower, concatenated."""
    L = keras.layers
    img = keras.Input((48, 48, 3), batch_size=1, name="image")
    tab = keras.Input((10,), batch_size=1, name="features")
    x = L.Conv2D(16, 3, strides=2, activation="relu")(img)
    x = L.DepthwiseConv2D(3, depth_multiplier=2, padding="same", activation="relu6")(x)
    x = L.GlobalAveragePooling2D()(x)
    t = L.Dense(16, activation="selu")(L.BatchNormalization()(tab))
    h = L.Concatenate()([x, t])
    score = L.Dense(1, name="score")(L.Dense(32, activation="gelu")(h))
    probs = L.Dense(4, activation="softmax", name="probs")(h)
    return keras.Model([img, tab], [score, probs])


def gru_attention(keras: Any) -> Any:
    """A sequence [30, 8] -> GRU (sequences) -> dot-product Attention over itself ->
    GlobalAveragePooling1D -> Dense (a sensor-sequence classifier)."""
    L = keras.layers
    x0 = keras.Input((30, 8), batch_size=1, name="sensor")
    h = L.GRU(24, return_sequences=True)(x0)
    a = L.Attention()([h, h])
    x = L.GlobalAveragePooling1D()(L.Add()([h, a]))
    return keras.Model(x0, L.Dense(3, activation="softmax")(x))


def activations_zoo(keras: Any) -> Any:
    """Rescaling, Normalization and Resizing inside the model, then convolutions (dilated,
    grouped) and dense layers under the activations Keras offers beyond ReLU."""
    import numpy as np

    L = keras.layers
    x0 = keras.Input((40, 40, 3), batch_size=1, name="image")
    x = L.Rescaling(1 / 127.5, offset=-1)(x0)
    norm = L.Normalization(mean=np.array([0.1, 0.2, 0.3]), variance=np.array([1.5, 2.0, 0.5]))
    x = L.Resizing(32, 32, interpolation="bilinear")(norm(x))
    x = L.Conv2D(16, 3, dilation_rate=2, padding="same", activation="softplus")(x)
    x = L.Conv2D(16, 3, groups=4, padding="same", activation="softsign")(x)
    x = L.LeakyReLU(negative_slope=0.2)(x)
    x = L.PReLU(shared_axes=[1, 2])(L.Conv2D(8, 1)(x))
    x = L.Activation("hard_sigmoid")(x)
    x = L.Flatten()(L.AveragePooling2D(4)(x))
    x = L.Dense(16, activation="tanh")(x)
    x = L.Dense(16, activation="exponential")(L.Dense(16, activation="mish")(x))
    return keras.Model(x0, L.Dense(3, activation="log_softmax")(x))


def stft_audio_classifier(keras: Any) -> Any:
    """A waveform [16000] -> ``tf.signal.stft`` (400-sample frames, 160 apart, 512-point
    transform) -> magnitude -> a mel matrix -> log -> Conv1D -> average -> softmax (an audio
    classifier that keeps its front end inside the model)."""
    import tensorflow as tf

    class LogMel(keras.layers.Layer):  # type: ignore[misc,name-defined]
        def call(self, wave: Any) -> Any:
            spec = tf.abs(tf.signal.stft(wave, 400, 160, fft_length=512))
            mel = tf.signal.linear_to_mel_weight_matrix(40, 257, 16000, 20.0, 7600.0)
            return tf.math.log(tf.matmul(spec, mel) + 1e-6)

    L = keras.layers
    x0 = keras.Input((16000,), batch_size=1, name="wave")
    x = L.Conv1D(32, 3, padding="same", activation="relu")(LogMel()(x0))
    x = L.GlobalAveragePooling1D()(x)
    return keras.Model(x0, L.Dense(10, activation="softmax")(x))


def nms_detector(keras: Any) -> Any:
    """An image -> a small conv head -> 64 boxes and scores -> ``tf.image
    .non_max_suppression_padded``-style selection (NON_MAX_SUPPRESSION_V4, padded to 10)
    -> the selected boxes (a detector that keeps its post-processing inside)."""
    import tensorflow as tf

    class Select(keras.layers.Layer):  # type: ignore[misc,name-defined]
        def call(self, boxes: Any, scores: Any) -> Any:
            idx, _ = tf.raw_ops.NonMaxSuppressionV4(
                boxes=boxes[0], scores=scores[0], max_output_size=10, iou_threshold=0.5,
                score_threshold=0.2, pad_to_max_output_size=True,
            )  # fmt: skip
            return tf.gather(boxes[0], idx)

    L = keras.layers
    x0 = keras.Input((32, 32, 3), batch_size=1, name="image")
    x = L.Conv2D(16, 3, strides=2, padding="same", activation="relu")(x0)
    x = L.Conv2D(5, 3, strides=2, padding="same")(x)  # 8x8 cells of (4 box values, score)
    x = L.Reshape((64, 5))(x)
    boxes = L.Activation("sigmoid")(x[..., :4])
    scores = L.Activation("sigmoid")(x[..., 4])
    return keras.Model(x0, Select()(boxes, scores))


def onehot_positions(keras: Any) -> Any:
    """Category ids [20] -> ``tf.one_hot`` (depth 50) and ``tf.range`` positions one-hot
    too -> Dense layers (a tabular model that encodes its categories inside)."""
    import tensorflow as tf

    class Encode(keras.layers.Layer):  # type: ignore[misc,name-defined]
        def call(self, ids: Any) -> Any:
            pos = tf.one_hot(tf.range(tf.shape(ids)[1]), 20)
            return tf.concat([tf.one_hot(ids, 50), pos[None]], axis=-1)

    L = keras.layers
    ids = keras.Input((20,), batch_size=1, dtype="int32", name="ids")
    x = L.Dense(32, activation="relu")(Encode()(ids))
    x = L.GlobalAveragePooling1D()(x)
    return keras.Model(ids, L.Dense(3)(x))


def simple_rnn(keras: Any) -> Any:
    """A sequence [15, 6] -> SimpleRNN (sequences) -> SimpleRNN -> Dense."""
    L = keras.layers
    x0 = keras.Input((15, 6), batch_size=1, name="seq")
    x = L.SimpleRNN(16, return_sequences=True)(x0)
    x = L.SimpleRNN(8)(x)
    return keras.Model(x0, L.Dense(2)(x))


def gru_classic(keras: Any) -> Any:
    """A sequence [20, 10] -> GRU with the reset gate before the product (reset_after=False,
    sequences) -> GRU going backwards -> Dense."""
    L = keras.layers
    x0 = keras.Input((20, 10), batch_size=1, name="seq")
    x = L.GRU(32, reset_after=False, return_sequences=True)(x0)
    x = L.GRU(16, go_backwards=True)(x)
    return keras.Model(x0, L.Dense(3)(x))


def lstm_options(keras: Any) -> Any:
    """A sequence [16, 8] -> LSTM with ReLU activations and no bias (sequences) ->
    Bidirectional LSTM merged by sum -> Dense."""
    L = keras.layers
    x0 = keras.Input((16, 8), batch_size=1, name="seq")
    x = L.LSTM(24, activation="relu", use_bias=False, return_sequences=True)(x0)
    x = L.Bidirectional(L.LSTM(12), merge_mode="sum")(x)
    return keras.Model(x0, L.Dense(2)(x))


BUILDERS: dict[str, Callable[[Any], Any]] = {
    f.__name__: f
    for f in (
        text_classifier,
        keyword_spotter,
        conv_autoencoder,
        bilstm_tagger,
        small_cnn,
        two_tower,
        gru_attention,
        activations_zoo,
        stft_audio_classifier,
        nms_detector,
        onehot_positions,
        simple_rnn,
        gru_classic,
        lstm_options,
    )
}
