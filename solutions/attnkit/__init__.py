"""attnkit: the reference implementation of the attention course.

One module per concept, in the order the book teaches them:

* :mod:`attnkit.attention`: ``softmax``, ``scaled_dot_product_attention`` (chapter 01)
* :mod:`attnkit.plotting`: attention heatmaps used throughout the book
"""

from attnkit.attention import scaled_dot_product_attention, softmax
from attnkit.device import default_device

__all__ = ["softmax", "scaled_dot_product_attention", "default_device"]
__version__ = "0.1.0"
