"""The reference Wide ResNet of the Olivia guide."""

import torch.nn as nn


def conv_bn_relu(in_channels: int, out_channels: int) -> nn.Sequential:
    """3x3 convolution, batch norm, ReLU: the building brick of the reference network."""
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(inplace=True),
    )


class ResidualBlock(nn.Module):
    """Two conv-bn-relu bricks with dropout between; a 1x1 projection when the width changes."""

    def __init__(self, in_channels: int, out_channels: int, dropout: float):
        super().__init__()
        self.body = nn.Sequential(
            conv_bn_relu(in_channels, out_channels),
            nn.Dropout(p=dropout),
            conv_bn_relu(out_channels, out_channels),
        )
        # The reference projects with a biased 1x1 convolution, only where widths differ.
        self.shortcut = (
            nn.Conv2d(in_channels, out_channels, kernel_size=1)
            if in_channels != out_channels
            else nn.Identity()
        )

    def forward(self, x):
        return self.body(x) + self.shortcut(x)


class WideResNet(nn.Module):
    """The Wide ResNet of the Olivia guide (about 17.2 M parameters for 100 classes).

    Stem of 16 channels, three stages of `blocks_per_stage` residual blocks at widths
    `width`, 2*`width`, 4*`width` (160/320/640 by default), 2x2 max-pooling after the first
    two stages, global average pooling and a linear head.
    """

    def __init__(self, num_classes: int, width: int = 160, blocks_per_stage: int = 2,
                 dropout: float = 0.01, stem_width: int = 16):
        super().__init__()
        widths = [width, 2 * width, 4 * width]
        layers: list[nn.Module] = [conv_bn_relu(3, stem_width)]
        in_channels = stem_width
        for stage, out_channels in enumerate(widths):
            for _ in range(blocks_per_stage):
                layers.append(ResidualBlock(in_channels, out_channels, dropout))
                in_channels = out_channels
            if stage < len(widths) - 1:
                layers.append(nn.MaxPool2d(2))
        # Adaptive pooling instead of the reference's AvgPool2d(7): identical on 32x32
        # inputs (8x8 maps give one window either way) and correct for any image size.
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(in_channels, num_classes)

    def forward(self, x):
        return self.fc(self.features(x))
