"""Real labelled crater image sets that the project can use, each fetched outside git and checked
file by file against the SHA-256 it was catalogued with (docs/real_crater_sets.md is the card of
each: source, licence, resolution, label rule).

A set comes from a public repository snapshot: a bare git directory or an ordinary checkout. :func:`install_set`
copies the set's files from it at the catalogued commit into a directory outside the work tree
and refuses any file whose hash differs; :func:`verify_set` re-checks a copy.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from trn.data.files import read_from_snapshot
from trn.errors import ConfigError, DataError
from trn_board.bundle import sha256_file


@dataclass(frozen=True)
class RealSet:
    """name: what the command line calls it; repo: OWNER/NAME on GitHub; commit: the catalogued
    commit; files: {path in the repository: SHA-256 hex}."""

    name: str
    repo: str
    commit: str
    files: dict[str, str]

    @property
    def mirror_name(self) -> str:
        return self.repo.replace("/", "+")


def _manifest(text: str) -> dict[str, str]:
    return {path: digest for digest, path in (line.split(None, 1) for line in text.strip().splitlines())}


# LRO NAC crops with hand-drawn crater boxes (CraterDANet; GPL-3.0): 12 training and 8 test images
CRATERDANET_NAC = RealSet("craterdanet-nac", "yizuifangxiuyh/Lunar_Crater_Detection_Data",
                          "ed5464dc1ac5973b86277157b04d2c17e599f3cf", _manifest("""
9483b41ce7559878b1107e86cccffe90c6a8bf6ea44acb35441401c4201f9be6  LRO_DATA/test/M115143943RE_cal_echo_2_2.png
2b40876863e4c2ca150260ef097b31e60761fb038b3c523b4feacf9f823338e6  LRO_DATA/test/M115143943RE_cal_echo_2_2.txt
40390a3ebf2ef457d781c5e19fb8cfe374669ab3cb0630d203a1f4034e7d855a  LRO_DATA/test/M1183658592LE_cal_echo_23_0.png
5716cbe347b55e66f409d9660b8c4845a7e50f767e1bf5e5eac871ff6cfad424  LRO_DATA/test/M1183658592LE_cal_echo_23_0.txt
cc98172db32a05b485a1a10ce59747f47c15406bfffcd18a2edcf7b090de2276  LRO_DATA/test/M1229577647LE_cal_echo_14_4.png
e797797d76940501b352cd587f80330617f2fbe35a7986285824b12adb30ef4c  LRO_DATA/test/M1229577647LE_cal_echo_14_4.txt
9604d86a1948cd06b27ed71836be3b36f04d7e9e07a544d1ef8bcf58ccdb45ab  LRO_DATA/test/M1303619844LE_cal_echo_26_2.png
bedd0a682214e5faab724f6926978c7f0b56706526dbd98cfe5ba480a0750e75  LRO_DATA/test/M1303619844LE_cal_echo_26_2.txt
24ca24a5b208f872256b5e1eb0f52fdf35902c71db62b65d7dceff0988c11ab8  LRO_DATA/test/M1303640934LE_cal_echo_map5_7_0.png
a76951040d946c8cfa2041bdef40fe5c3845fef222e6ef86ce7ed302a1d0ef2a  LRO_DATA/test/M1303640934LE_cal_echo_map5_7_0.txt
2bc6c224ad9913ed477593e99267d2dd2fde40316fd1771aa7b722d5ad37102b  LRO_DATA/test/M1305967189RE_cal_echo_11_2.png
b8795e18626b10fac36aa9c136c14feef948837c64add7cfbaec81593ce852cc  LRO_DATA/test/M1305967189RE_cal_echo_11_2.txt
0c63ad28d7220a521112549be6a725342f8ba7ee50f0463f0e02916b89d985bf  LRO_DATA/test/M1309534046LE_cal_echo_9_2.png
bc824caa4c51f1e2a7a18d844c310c2adf76a225126c80c4433b27851279e7aa  LRO_DATA/test/M1309534046LE_cal_echo_9_2.txt
6a4b1b16ed231f50b0f0b21585f08e7ff57f219a991a9861584335caec02062c  LRO_DATA/test/M161142858RE_cal_echo_1_2.png
b1d8e945854a46b92616bb49966374e44bc0d78ea626b2b29eb057ecbe5f8d13  LRO_DATA/test/M161142858RE_cal_echo_1_2.txt
25dc53d3f8d99c94896d33a111ddd0cde528a6fa6f1bc2fc8dc37afd4137555e  LRO_DATA/train/M115143943_mosaic_train_small.png
941e62a4527be39b8abcec7481d9a20658b4e05467a7876aeb2eff77babc3fb1  LRO_DATA/train/M115143943_mosaic_train_small.txt
66de57f1a582fc499c7ebc07c253646cd235d96cd1fe1b6927d27ee7f39e0f20  LRO_DATA/train/M1155395732_mosaic_train_small.png
24beff3141868c6677e67f456fa88387a98555122863cb7daf06c638efb4ecec  LRO_DATA/train/M1155395732_mosaic_train_small.txt
23bd53f99a1c86927c9289ba795ec40e0728c2cdd99213ce2060cea29b43fb71  LRO_DATA/train/M1183658592_mosaic_train_small.png
f61070cbe4e13601ed5e639dc0363e2cd5fb0e74fdae6c64eef8f0a4a2e014b8  LRO_DATA/train/M1183658592_mosaic_train_small.txt
94a49d331147e159cda9f10416f734b0d1942c232f94aa25200be47f0411af85  LRO_DATA/train/M1229577647_mosaic_train_small.png
b19901ea532981245e6e78101d5fcc70f7c4de41860cdfb064f71749fd826d48  LRO_DATA/train/M1229577647_mosaic_train_small.txt
e8e74133a29785870e79258b6d067424ffbd2670000ca5851c2bd9b35d2ecf24  LRO_DATA/train/M1231933714_mosaic_train_small.png
8b9d512d57bdddae5a530f7d4b464b9d15f3b20c521e130d1cc77125dbda7a0f  LRO_DATA/train/M1231933714_mosaic_train_small.txt
46602aafa269547f614dd9b0462c4acdc0a97d9b71c098e6865324d82f488a92  LRO_DATA/train/M1266003170_mosaic_train_small.png
4385e0678641a2dc316e824ff97b8537a305ef41c7c235587adcbd324c762910  LRO_DATA/train/M1266003170_mosaic_train_small.txt
4c4ac70095360bd38ee807bf6053bafcc6c2fee7b9a54e28e1a157f536ea38e7  LRO_DATA/train/M1275410097_mosaic_train_small.png
f87875d3507d1d688c329571a17df0928c05d7cf379e6806f774dcd5148bd4db  LRO_DATA/train/M1275410097_mosaic_train_small.txt
6f02a4b9e483c8ed283380160800fd222393cde187c70c6e615fed4873bc6aa7  LRO_DATA/train/M134022629_mosaic_train_small.png
bde5937845238622bc4d158c33407ce78526f7460674ffefbbf1298dac84de94  LRO_DATA/train/M134022629_mosaic_train_small.txt
79514ddb11bc66a9ddcfc9349008bb1df12a09b7732e1eb8e6f04f0f5a702242  LRO_DATA/train/M161142858_mosaic_train_small.png
0e10b08639b48b19e18f9181fd1b030a202ef415c6b2385f2bc4ca3d60a4ea8d  LRO_DATA/train/M161142858_mosaic_train_small.txt
66492445fa5dd34e90f0258f36693b8865eaf4969cc5751141bc121b49fdafdd  LRO_DATA/train/M161149639_mosaic_train_small.png
fc5c9b1501d4074917615492c797dca9569759f96290dd774476c31ce0d80fe3  LRO_DATA/train/M161149639_mosaic_train_small.txt
7b611c2f7b3a458ca808e0dfe1874aab45baf3f832cae04ea28185510434b074  LRO_DATA/train/M180000082_mosaic_train_small.png
66e4f00565f66aea133a9b03b9b08ade7029b85205c22aa5187570b4512fd9cf  LRO_DATA/train/M180000082_mosaic_train_small.txt
a72e6a95f00121e0ab88589e34c5ddbb2c368bb8cd32a2654d9fe560475369ed  LRO_DATA/train/M180007222_mosaic_train_small.png
1490e47d3363011986583547926ace4eb360191ebaf785e0c1ea16be495dcec6  LRO_DATA/train/M180007222_mosaic_train_small.txt
"""))

# Mars CTX mosaic (20-14 S, 174-180 E) with Robbins-catalogue craters of 1-32 km (MIT): 81 tiles
# of 416 px cut from one 3,744 px mosaic, and the labels' boxes in that mosaic's pixels
ROBBINS_CTX_MARS = RealSet("robbins-ctx-mars", "Yitongishere/YOLOv3-crater-detection",
                           "a4fbdd5b1905440e55630b989255a313d6e99888", _manifest("""
2b8023e533c9561d87ee69a729885234c655f85f8e47b5cad185d56a52ecbc0b  CTX/cropped_images/stacked_CTX_00_00.png
513493dda178a85e06cc6ebfae7c7bbac6389fd2d18be58fc6f2155c6a867da0  CTX/cropped_images/stacked_CTX_00_01.png
028bbda2152d436e28fb48f4711c8a574b42bf134ae2f7ba2162f516a79f1579  CTX/cropped_images/stacked_CTX_00_02.png
06dc41341c55e0b5897c2e45240b67d9d5cb3f0edcd4de41dfa009cd2c5815bc  CTX/cropped_images/stacked_CTX_00_03.png
41e61e797eead93a04248e9ddb70aa6c16917186dd5c16c80463e65faf0d59a2  CTX/cropped_images/stacked_CTX_00_04.png
023eba6b56ee57cde8acdf0f076638bcfa4eb090554eabf7d995f3d37c4546bb  CTX/cropped_images/stacked_CTX_00_05.png
9ab9e43573dc7a72eda10d28185e7270158f2213e4e829d4010cea0fb493bd0e  CTX/cropped_images/stacked_CTX_00_06.png
1d3b49cb6c6b1b1c93afdf9f7427667a30315e8464c2d064f6a2b4755719dce9  CTX/cropped_images/stacked_CTX_00_07.png
b3b2d1e783d60e96390f665ced5708a671828a2e081d9dcc967b751b26846383  CTX/cropped_images/stacked_CTX_00_08.png
17b2636b668b85c5335ead6125bcfda62cc196e5d732e60b71cadf2b72e57174  CTX/cropped_images/stacked_CTX_01_00.png
3c5290ba6ad90de678d8ab41e0195962370ed78a670c40f43c504145f2f7c85b  CTX/cropped_images/stacked_CTX_01_01.png
b5935da87e1fe811f2f570a8a3464413a8545a03e23bda8b595f8805f2ef6d8f  CTX/cropped_images/stacked_CTX_01_02.png
fbf6465541f58ebfafd5f80ca1699fa9e6f71241a43b5fb08c60f41772b29fcd  CTX/cropped_images/stacked_CTX_01_03.png
b9b41cdb2a1c05a646cc7e5113e9181eb0d533eb347b9b5e3638b30c19123f91  CTX/cropped_images/stacked_CTX_01_04.png
8539e72d9f513fff3a68b16328bdf5dc8b04844006286a58fc99e55580cbc4e9  CTX/cropped_images/stacked_CTX_01_05.png
94f4d8f9d2038556b52681c7d3ef2f9206d4fed84b01e3d1442169eb8720055d  CTX/cropped_images/stacked_CTX_01_06.png
6137d4ae149b66d07eb742f0795af2608759ecac55030b4f1f792f7250561c3f  CTX/cropped_images/stacked_CTX_01_07.png
ce24b6052c2a8bcd8c403b1bcab7cc414f76b22043d448868838496d5564f3cd  CTX/cropped_images/stacked_CTX_01_08.png
23c670689d7fd8b449e6c7d4a5c24654824a02f1bccd5873e1f7512380873667  CTX/cropped_images/stacked_CTX_02_00.png
6e857729a0d0029f44170d8e41cbc736452627201f258299f1ea53e0f315125f  CTX/cropped_images/stacked_CTX_02_01.png
c7f4e886b0ecf830d26ed4f1fbef58e152c6334afded2414aabb94629e2802c3  CTX/cropped_images/stacked_CTX_02_02.png
9d828958196b6de41346939cb009c9f7d6e34e6040bd8141bf48ec320f8caf9f  CTX/cropped_images/stacked_CTX_02_03.png
14e5454cc20ab6284cb190bee0218b39453e0985b5143a62f5d892cfccebaef8  CTX/cropped_images/stacked_CTX_02_04.png
74fd4a5e91f332c6e801ca9d6a722639afea6c449c94b72af19732f41f007355  CTX/cropped_images/stacked_CTX_02_05.png
c1ed27e2eda2d0d6806ce60e78db6e6deae592784849d7781baaf70616198603  CTX/cropped_images/stacked_CTX_02_06.png
2d66d09ed9b63e968f6dab2ebaca6d3a9dfbac647dedc77aa02ba4ceabd1ee02  CTX/cropped_images/stacked_CTX_02_07.png
e820842d9dff4ef9d3e1dd6d638524a308ecfa5f46e930914f375a0aa50d5d08  CTX/cropped_images/stacked_CTX_02_08.png
cdce683580faf87cf9aec2f203b6226ea8c1c4b501b926d14941031561bd0f00  CTX/cropped_images/stacked_CTX_03_00.png
18d03bb7d54bdcfda60d6bcf5e8a2979f37ed930b492add4461f832beb00937b  CTX/cropped_images/stacked_CTX_03_01.png
c5419b35d6ea69975c46d8d279fb4bf35b5f001cfc6301a41ce27efdd01ee5a0  CTX/cropped_images/stacked_CTX_03_02.png
0eff6ca40fce48e8b6a862b3677acec00de5157e3bbfc66b88a6bbd49797eb1c  CTX/cropped_images/stacked_CTX_03_03.png
2241c8a7d5878815cb99d2fb6f300f94a8207342928c8bbe3449d607ed77b559  CTX/cropped_images/stacked_CTX_03_04.png
10929763ca24e4d363e39935b6cb01a95023a6341758a4c5dcb126ab820dfeef  CTX/cropped_images/stacked_CTX_03_05.png
03de186f5647d4602cf8fa4a5b2a8122122f8fd0fe824e300df9fc4cdfce0ac5  CTX/cropped_images/stacked_CTX_03_06.png
42c3523879afb9fde46bfba4971220a420d33cf0c300586ffb4cdb6df3ab3a6a  CTX/cropped_images/stacked_CTX_03_07.png
390aca70ba33eccbc254fbca68cb1807d37c216b60cf352a912997f4324e53c6  CTX/cropped_images/stacked_CTX_03_08.png
b6c0b9b98369020a336a19cc2a16a9ec30cfbbf81364aecef633e23fa893fe99  CTX/cropped_images/stacked_CTX_04_00.png
ac4f44da1ea4f256256fa821ff6815149fce05537d3755023d1920e8df7afc9d  CTX/cropped_images/stacked_CTX_04_01.png
385c3131fdbe8abddf199a0526370e823d8133e87f29aef04cfc6a4595dc0abd  CTX/cropped_images/stacked_CTX_04_02.png
87dad3b0509f29c3ce98697d037843b1af0266b762b335415711b85e87553c2c  CTX/cropped_images/stacked_CTX_04_03.png
397edbd83f2843a8e69b4cc82ffc49b70e9602cc68d5236f5efe628bebda1ff8  CTX/cropped_images/stacked_CTX_04_04.png
2b5fbe74377250f5f14eddfe93cda9077855f58e0cd6a2caf9bec82c990efd9e  CTX/cropped_images/stacked_CTX_04_05.png
275d6027a665d54e68e3ecd5e3778472faafeb0f491c35b01ceccc61285a9f46  CTX/cropped_images/stacked_CTX_04_06.png
886fdabf0e1f0fc837cd7d57044aaea19e9888c7525c09cfcbd099e193550003  CTX/cropped_images/stacked_CTX_04_07.png
91d01d4f02f7fe7b2efdefe7d19f168a0d0b8cf06fadb72d4a94aacf0783878b  CTX/cropped_images/stacked_CTX_04_08.png
545e7e8cf1542cd3f71b5b26138fb9807f3054ee4ced8ec0518303a6eba8f44e  CTX/cropped_images/stacked_CTX_05_00.png
da6eac17d0372709c3a1d59c76bcde7a08c302566de71d2ed36ca6fa14fe330e  CTX/cropped_images/stacked_CTX_05_01.png
54d4c87d29583958e9ce456fd992da64973d19dc278e5a82645e2b94d0a2ce16  CTX/cropped_images/stacked_CTX_05_02.png
1e538d319f68b0c5fcfa04863ef304caa5d1ca94aa1e2fcd3a28a176265523ee  CTX/cropped_images/stacked_CTX_05_03.png
496ef05c55c4c31d9e610b21e4c3bd72e73ddbd137f929bf88871c6ea69d8bae  CTX/cropped_images/stacked_CTX_05_04.png
bccb39817d89438d5fecd1fca8954ef7834ccafcdd3fb43ae8052b851657adf8  CTX/cropped_images/stacked_CTX_05_05.png
ee208c7eb296f1607c2cc522439bc342d975088abd8372d91d20838f643b5072  CTX/cropped_images/stacked_CTX_05_06.png
ecdd51f229badc5778764edf878e765a0d5c6594d4d1da11b3a5fe4d0b763270  CTX/cropped_images/stacked_CTX_05_07.png
cfd7830adc8eab8953494dcadc2a71f2699366a0e55fb9e28b704adcc19240db  CTX/cropped_images/stacked_CTX_05_08.png
f67e4bbaad324d013193f97b1205251bc4de3007aef0ae8cbad37060073387d5  CTX/cropped_images/stacked_CTX_06_00.png
46d0edbbebbe32d81eb9804e820cbf8073707b0f84a4cd80e4119093f62a28d2  CTX/cropped_images/stacked_CTX_06_01.png
6a109184a72deb903374bde8761f74d0092d20d2f45a8ccaec7144adcb28d85a  CTX/cropped_images/stacked_CTX_06_02.png
e501f0473f6a0df63928008846a3c4e37f186c535c09b657796b4f8e166aa25a  CTX/cropped_images/stacked_CTX_06_03.png
fb6d09664c94cdb98b8bf657f51699ef124cc65a8e397ac9766393675e383b0e  CTX/cropped_images/stacked_CTX_06_04.png
079162ef90b31ccae58aac94891ef1698567ccea00590d3700d8283b9edba18c  CTX/cropped_images/stacked_CTX_06_05.png
e3164d0697a4612545b9efe35cd8cd7bc9a0ab856e7944713d21d931847ae012  CTX/cropped_images/stacked_CTX_06_06.png
973c32dbf7876bd4329eff00f927de0c0b68ae3243bae644f3993ec8c84d6cb8  CTX/cropped_images/stacked_CTX_06_07.png
0c178a4295f72276a28d61901428821775ce7b0d1683f00adb79f3973bfd0dcb  CTX/cropped_images/stacked_CTX_06_08.png
53eb8f5a23d085550cf0864267903d85e1529271d70cdbe6c1a01f11c9dbe67b  CTX/cropped_images/stacked_CTX_07_00.png
5d7ca87fabefd425c65ee5186b81573802d3511ea1cbcb989de735ff5fdddf46  CTX/cropped_images/stacked_CTX_07_01.png
80f4a41bd95eed917ebcc8a67ff392ac7dce0f0cf5af82a3b4c2d7fdd7838573  CTX/cropped_images/stacked_CTX_07_02.png
8f84beb060ed73bceb06729bd02565717dfc5acf723bf14e0459ebe4503eeb80  CTX/cropped_images/stacked_CTX_07_03.png
de06cd7bd628973660fd5768dd2eedfccad309f56f498ce2a1fe3db1a39d011a  CTX/cropped_images/stacked_CTX_07_04.png
a11719943b6ec083d9620d9e075f0d591723bd9703ba6611e4669fe3c056a87f  CTX/cropped_images/stacked_CTX_07_05.png
8a0e69cce1f7c52f4bf07a28fdc46a98031b6ba26ef29b256792743a0ae25487  CTX/cropped_images/stacked_CTX_07_06.png
46ca3dc725c29375ad576eb00ed68b21fdd5ec211c597c78943b37c43318d67d  CTX/cropped_images/stacked_CTX_07_07.png
83c5a94f5c326833cdb9ec8e9ba1c2e51591e78275b9c0cbdc3eac80561d6428  CTX/cropped_images/stacked_CTX_07_08.png
14a72cc4358b497b78f18ee796baaf1cacb36210cb11116698ef9621c8b227e8  CTX/cropped_images/stacked_CTX_08_00.png
92589d1648bd0b03d874e1e2ba7269b0a53ad62fc160a3080a890a84dbb8b3b7  CTX/cropped_images/stacked_CTX_08_01.png
108221cfc770a153339bf67cfa684f5947b14efc77c2b3f95ff7bc99ce98a5f1  CTX/cropped_images/stacked_CTX_08_02.png
201a501bab48d3334ad0ab734ffaf9aeb5e1521307545c7098e21fc013dce32d  CTX/cropped_images/stacked_CTX_08_03.png
1ca1cc2f3a731c30abc59145cd80b1ff9e9fcfd950a0f2743e094a768026e89b  CTX/cropped_images/stacked_CTX_08_04.png
1701e90e06d9b0e7b9b2be4e61385b887393a03ecd92b8ce83f385a18a518186  CTX/cropped_images/stacked_CTX_08_05.png
c3e55e9cefa735d5a6f6b406821f4edc83031f041304cbaf289b513d4f0f6123  CTX/cropped_images/stacked_CTX_08_06.png
37e12758f520b3280b713bafcc5e100e2f3799de4645a55ab0e16bbd25901b63  CTX/cropped_images/stacked_CTX_08_07.png
eed8d9c3431791f42730ae456c8f7ea633a0c78832fa787e41924ad0f8b641e9  CTX/cropped_images/stacked_CTX_08_08.png
b78facf43c45896e7341ac54a50273b7db7c9943255670ba08c300cd3b21cd5b  CTX/selected_craters_XY.txt
"""))

# Mars CTX at 6 m per pixel, MC-11 East (CC BY 4.0): 12 tiles of 2,000 px, each crater boxed by six
# annotators and merged (confidence: how many marked it), and an expert's boxes on 4 tiles
FRANCIS_CTX_MARS = RealSet("francis-ctx-mars", "aliFrancis/mars-crater-catalogue",
                           "cafa91458ef54f1f933a901fbbf77f89df594d8d", _manifest("""
7e7170e3cebf88a9f60c7b8421418323c09304da1af4d5e90f4da1dc1c8a2661  LICENSE.txt
6e8958025f1dcf3563c4e7a33f8d875fd9948dc1fc1e95e2df00e828a9b930c5  data/annotations/clustered/MC11E-A.xml
3e38cf51a9b6e8563b88955a2d694bdb12589c901f405b6e6ee17b57fa49c2c8  data/annotations/clustered/MC11E-B.xml
dc77c1627527672c343fb95debbba09e3979fbbc03b83316715468f762c93f52  data/annotations/clustered/MC11E-C.xml
06c299b6354e5c87b53078d536901a53bf4be1ce8cfecbafd97cb1287e8cb24d  data/annotations/clustered/MC11E-D.xml
113ad87b65638a9de5fa0c8bcc88d1e3f67bb0e47c6ca6d8e83b43ae3d331a3e  data/annotations/clustered/MC11E-E.xml
1f454edd297d4f8e844206395bd90cddb9335cff9f7bbef9ab1965c8ffc1e393  data/annotations/clustered/MC11E-F.xml
35cb173a28d46508ac6756d4f59d0116b1910138c9c25e0f26f98068de031ea8  data/annotations/clustered/MC11E-G.xml
84f6aef2cec343c7cafd1403d58e42f97f3f39158b778091922aeecb2dbe5de6  data/annotations/clustered/MC11E-H.xml
eaa4bc6402a3fe7530d8b934b468d69e347ee68e0d302c24663e6395ce53fd00  data/annotations/clustered/MC11E-I.xml
87f2796a4af8fe67a8e6fac4b0f26c2db086956e7cdfa5438d0f54d676e27693  data/annotations/clustered/MC11E-J.xml
07b53cd3b0e19c7653e1c21380f915495fb61be422a3ac1e0f1e9607a3f9a7be  data/annotations/clustered/MC11E-K.xml
45e3b692803f119b979850aa5f768c9b03c05eeebc3b6ef84d0d872bb54e25f4  data/annotations/clustered/MC11E-L.xml
b5a87e8ed1e284e78b533efce114d5c580fb035245c2a529d694d9ffa3ff182f  data/annotations/expert/MC11E-D.xml
da125ccef3d2c97538cf0dab815e158b29ed87dc9aa89970e9bdc5f74a021a72  data/annotations/expert/MC11E-F.xml
5fb7768d24f62d3cd44bbc28c0604e20fcdcbc39176bd316605be6a85a3b71b7  data/annotations/expert/MC11E-K.xml
74f3cd728ca4ea79217c184eee4f397c42d10e7d811637f66e4f0eacb368067f  data/annotations/expert/MC11E-L.xml
7bd10c568b9b97719b91890c33aea7bdb0975e8abbb224f63877c96ba32ffd6f  data/images/MC11E-A.png
84be8e31f95162a622a884c642e35394a451c9279757f2df5249579b75aeef79  data/images/MC11E-B.png
230f03cbc8bad2c96fb54a5a7c086c991a66d772c8382eef2de42b49a5aa8338  data/images/MC11E-C.png
874d05e94ee03c7f476e392a4e7484a109f9e4799d9b935aac5d7e51e87527fa  data/images/MC11E-D.png
9a9660f0f615bc793f9181999146de347a1bdc85ef0758ab84d854cb80972428  data/images/MC11E-E.png
a0ce89ca29e2da8f8c624ab6ff89ea51fecf37d9f96900aa954c7c9c0a4c5659  data/images/MC11E-F.png
37395c2f95d6393cd63f620000fe6d0ca8b0fde27acef5592ca61cb8db3a8d46  data/images/MC11E-G.png
2ac52adab77395161592a8d69fb4e6916e496c7ea571c5b502dd5688a53a7ca6  data/images/MC11E-H.png
b0af3e5ceca00693152cef579f171946f84564e8cbe6478210970f048f9c9537  data/images/MC11E-I.png
c6c101d8aa42f9b9c9a153dc7d40d0688b539a420cdb1af63ab1b91f1ec331a0  data/images/MC11E-J.png
ad6b0c23ff9d20c65dc9f4bf00c5596fc402633d2f8af2065afb5a2a5031056e  data/images/MC11E-K.png
3eeb46ed9f5728e042517c3ac5c27a2b5b70272e114b569a0ace8b3373a41697  data/images/MC11E-L.png
"""))

# Mars THEMIS daytime infrared at 100 m per pixel (Apache 2.0 as the repository's README states):
# 777 tiles of 416 px from the USGS controlled mosaics of equatorial quadrangles, and the Robbins
# and Hynek (2020) catalogue's craters of 1 km and more as boxes. The 1,554 hashes are a file of
# their own (trn/detect/manifests/)
THEMIS_DAYIR_MARS = RealSet("themis-dayir-mars", "ACSE-jz1121/Crater_detection_self_training",
                            "bbd13588185012674c94b1e422a1f4c462536555",
                            _manifest((Path(__file__).parent / "manifests" / "themis-dayir-mars.sha256")
                                      .read_text(encoding="utf-8")))

REAL_SETS = {s.name: s for s in (CRATERDANET_NAC, ROBBINS_CTX_MARS, FRANCIS_CTX_MARS, THEMIS_DAYIR_MARS)}


def real_set(name: str) -> RealSet:
    if name not in REAL_SETS:
        raise ConfigError(f"unknown real image set {name!r}; known: {', '.join(sorted(REAL_SETS))}")
    return REAL_SETS[name]


def install_set(name: str, source: Path, out: Path) -> list[Path]:
    """Copy the set's files from the repository snapshot ``source`` into ``out`` (same relative
    paths), each checked against its catalogued SHA-256 before it is written; files already there
    with the right hash are kept. Returns the paths written or kept."""
    s = real_set(name)
    if not Path(source).is_dir():
        raise DataError(f"is not a directory; fetch {s.repo} first (a git snapshot or a checkout)", source)
    done = []
    for rel, digest in s.files.items():
        dst = Path(out) / rel
        if dst.is_file() and sha256_file(dst) == digest:
            done.append(dst)
            continue
        data = read_from_snapshot(Path(source), s.commit, rel)
        got = hashlib.sha256(data).hexdigest()
        if got != digest:
            raise DataError(f"{rel} has SHA-256 {got[:16]}..., the catalogue says {digest[:16]}...: not the "
                            f"catalogued file; fetch {s.repo} at {s.commit[:12]}", source)
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(dst.name + ".part")
        tmp.write_bytes(data)
        tmp.replace(dst)
        done.append(dst)
    return done


def verify_set(name: str, root: Path) -> list[str]:
    """The problems of a copy of the set under ``root``: missing files and files whose SHA-256
    differs from the catalogue (empty: the copy is whole)."""
    s = real_set(name)
    problems = []
    for rel, digest in s.files.items():
        f = Path(root) / rel
        if not f.is_file():
            problems.append(f"{rel}: missing")
        elif sha256_file(f) != digest:
            problems.append(f"{rel}: SHA-256 differs from the catalogue")
    return problems


# ---------------------------------------------------------------------------------------------
# Labelled images of a set, their split, and training frames cut from them

OBSERVATION = re.compile(r"M\d+")

# craterdanet-nac, split by NAC observation (docs/real_crater_sets.md says which and why): an
# observation's every file is in one split, and observations whose numbers (mission elapsed
# seconds) lie within a day of each other are in the same split (neighbouring orbits: the same
# Sun, possibly the same ground)
CRATERDANET_NAC_SPLIT = {
    **dict.fromkeys(("M1303619844", "M1303640934", "M1305967189", "M1309534046"), "test"),
    **dict.fromkeys(("M115143943", "M161142858", "M161149639"), "val"),
    **dict.fromkeys(("M1155395732", "M1183658592", "M1229577647", "M1231933714", "M1266003170", "M1275410097",
                     "M134022629", "M180000082", "M180007222"), "train"),
}

# robbins-ctx-mars is one image, the mosaic its 81 tiles were cut from, kept to check a detector on
# another body: it is never trained on, and settings chosen with it are chosen on validation
CTX_MOSAIC_NAME = "stacked_CTX"
# francis-ctx-mars, split by tile (fixed before any training, docs/real_crater_sets.md): the four
# tiles an expert also labelled are the test split, scored against the expert's boxes; two tiles
# choose settings; the other six train
FRANCIS_SPLIT = {**dict.fromkeys("DFKL", "test"), **dict.fromkeys("BI", "val"), **dict.fromkeys("ACEGHJ", "train")}
# a crater of the merged labels counts when at least this many of the six annotators boxed it
# (written down before any training: one annotator's boxes are mostly faint pits, and against the
# expert's tiles the boxes of two or more agree best in both directions)
FRANCIS_MIN_CONFIDENCE = 2
FRANCIS_TILE = re.compile(r"data/images/MC11E-([A-L])\.png")
THEMIS_TILE = re.compile(r"dataset_generation/416_train_val/train/images/crater(\d+)\.jpg")
THEMIS_TILE_PX = 416


def themis_split() -> dict[str, str]:
    """themis-dayir-mars, split by tile (fixed before any training, docs/real_crater_sets.md):
    tile name -> "train", "val" or "test", or "duplicate" for a tile whose image is byte for byte
    an earlier tile's (65 in the set; the earlier one is kept, with its labels). The tiles' places
    are not recorded and consecutive numbers are not neighbours, so each kept tile goes by a hash
    of its name: 15 % test, 15 % validation, the rest training."""
    files = real_set("themis-dayir-mars").files
    seen: dict[str, str] = {}
    out = {}
    for rel in sorted((p for p in files if THEMIS_TILE.fullmatch(p)), key=lambda p: int(THEMIS_TILE.fullmatch(p).group(1))):
        name = Path(rel).stem
        if files[rel] in seen:
            out[name] = "duplicate"
            continue
        seen[files[rel]] = name
        u = int(hashlib.sha256(f"themis-dayir-mars:{name}".encode()).hexdigest()[:8], 16) / 16 ** 8
        out[name] = "test" if u < 0.15 else "val" if u < 0.30 else "train"
    return out


SET_SPLITS = {"craterdanet-nac": CRATERDANET_NAC_SPLIT, "robbins-ctx-mars": {CTX_MOSAIC_NAME: "val"},
              "francis-ctx-mars": FRANCIS_SPLIT, "themis-dayir-mars": themis_split()}

CTX_TILE_PX = 416
CTX_GRID = 9  # rows and columns of tiles: the mosaic is 3,744 px a side
CTX_TILE = re.compile(r"CTX/cropped_images/stacked_CTX_(\d\d)_(\d\d)\.png")
# The labels were mapped from the Robbins catalogue's latitude and longitude onto the mosaic by a
# linear rule over 20-14 S, 174-180 E. Against the image they lie off by one constant shift (x, y):
# craters of 30 px and more found by two detectors sit (-4.6, +2.6) px (models/detector_real at its
# own scales, 142 craters) and (-4.5, +2.7) px (models/detector at the mosaic's sampling, 90) from
# their labels; after the shift, the median offset in each ninth of the mosaic is within 2.5 px
# (docs/real_crater_sets.md). The labels are moved by it.
CTX_LABEL_SHIFT_PX = (-4.6, 2.7)
# The labelled size range, box side in image px: craters of 1-32 km (the mapping's own size range)
# at 10.53 px per km (94.9 m per px)
LABELLED_SIDE_PX = {"craterdanet-nac": (8.0, float("inf")), "robbins-ctx-mars": (10.5, 337.0),
                    # the annotators' and the expert's smallest boxes: 3-6 px; nothing larger is left out
                    "francis-ctx-mars": (5.0, float("inf")),
                    # the catalogue's craters of 1 km and more at 100 m per px
                    "themis-dayir-mars": (10.0, float("inf"))}


@dataclass(frozen=True)
class RealImage:
    """One labelled image of a set: path of its PNG; observation (NAC ``M`` number); split; boxes
    float32 [k, 4] (l, r, t, b) in its pixels (x = column, y = row); doubtful: boxes in the same
    form that the set's labels leave in doubt (a crater fewer annotators drew than the set's rule
    asks), which training treats as neither a crater nor background and no score counts."""

    path: Path
    observation: str
    split: str
    boxes: np.ndarray
    doubtful: np.ndarray = field(default_factory=lambda: np.zeros((0, 4), np.float32))


def observation_of(path: str | Path) -> str:
    """The NAC observation a file of the set comes from: the ``M`` and digits its name starts with."""
    m = OBSERVATION.match(Path(path).name)
    if m is None:
        raise DataError("names no NAC observation (expected a name starting with M and digits)", Path(path))
    return m.group(0)


def read_boxes(path: str | Path) -> np.ndarray:
    """float32 [k, 4] (l, r, t, b) px of a CraterDANet label file: a header, then one box a line as
    ``ID, X, Y, W, H, C_X, CY`` (top-left corner, width, height, centre), separated by commas or
    tabs. A line that is not seven numbers, or a box of no width or height, is refused by line."""
    path = Path(path)
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines()[1:], start=2):
        if not line.strip():
            continue
        parts = re.split(r"[,\t]", line.strip())
        try:
            _, x, y, w, h = (float(v) for v in parts[:5])
        except ValueError:
            raise DataError(f"line {n} is not ID, X, Y, W, H, C_X, CY numbers: {line.strip()[:60]!r}", path) from None
        if len(parts) != 7 or not (w > 0 and h > 0):
            raise DataError(f"line {n}: expected 7 fields with W, H > 0, got {line.strip()[:60]!r}", path)
        rows.append((x, x + w, y, y + h))
    return np.array(rows, np.float32).reshape(-1, 4)


def read_corner_boxes(path: str | Path) -> np.ndarray:
    """float32 [k, 4] (l, r, t, b) px of a label file of one box a line as ``x1 y1 x2 y2`` (top-left
    and bottom-right corners, separated by spaces). A line that is not four numbers, or a box of no
    width or height, is refused by line."""
    path = Path(path)
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            x1, y1, x2, y2 = (float(v) for v in line.split())
        except ValueError:
            raise DataError(f"line {n} is not four numbers x1 y1 x2 y2: {line.strip()[:60]!r}", path) from None
        if not (x2 > x1 and y2 > y1):
            raise DataError(f"line {n}: the box has no width or height: {line.strip()[:60]!r}", path)
        rows.append((x1, x2, y1, y2))
    return np.array(rows, np.float32).reshape(-1, 4)


def read_voc_boxes(path: str | Path, min_confidence: int = 0, max_confidence: int | None = None) -> np.ndarray:
    """float32 [k, 4] (l, r, t, b) px of a Pascal VOC annotation file (``<object><bndbox>`` with
    ``xmin ymin xmax ymax``), keeping the objects whose ``<confidence>`` (when they have one) is at
    least ``min_confidence`` and, with ``max_confidence``, at most that (then an object without a
    confidence is not kept). The corners are taken as the file gives them (the rectangle's
    corners as drawn, the labelling tools' convention, not VOC's 1-based inclusive pixels). A file
    that is not such XML, declares entities, or has a box of no width or height, is refused by
    name."""
    import xml.etree.ElementTree as ElementTree

    path = Path(path)
    size = path.stat().st_size
    if size > 64 * 1024 * 1024:
        raise DataError(f"is {size:,} bytes, more than a label file of 64 MiB", path)
    data = path.read_bytes()
    if b"<!DOCTYPE" in data or b"<!ENTITY" in data:
        raise DataError("declares a DOCTYPE or entities, which a Pascal VOC label file never needs: refused", path)
    try:
        root = ElementTree.fromstring(data)
    except ElementTree.ParseError as exc:
        raise DataError(f"is not a Pascal VOC XML file ({exc})", path) from None
    rows = []
    for n, obj in enumerate(root.iter("object"), start=1):
        conf = obj.findtext("confidence")
        box = obj.find("bndbox")
        try:
            if conf is not None and int(conf) < min_confidence:
                continue
            if max_confidence is not None and (conf is None or int(conf) > max_confidence):
                continue
            x1, y1, x2, y2 = (float(box.findtext(k)) for k in ("xmin", "ymin", "xmax", "ymax"))
        except (TypeError, ValueError, AttributeError):
            raise DataError(f"object {n} has no numeric bndbox xmin ymin xmax ymax (or confidence)", path) from None
        if not (np.isfinite([x1, y1, x2, y2]).all() and x2 > x1 and y2 > y1):
            raise DataError(f"object {n}: the box has no width or height: {x1}, {y1}, {x2}, {y2}", path)
        rows.append((x1, x2, y1, y2))
    return np.array(rows, np.float32).reshape(-1, 4)


def read_yolo_boxes(path: str | Path, width: int, height: int) -> np.ndarray:
    """float32 [k, 4] (l, r, t, b) px of a YOLO label file (``class xc yc w h`` a line, the centre
    and size as fractions of the image's ``width`` x ``height``). A box may reach past the image's
    edge (a crater larger than the tile, or cut by it) and is kept as the file gives it. A line that
    is not five numbers, a box of no width or height, a centre off the image or a side over twice
    the image's is refused by line."""
    path = Path(path)
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            _, xc, yc, w, h = (float(v) for v in line.split())
        except ValueError:
            raise DataError(f"line {n} is not five numbers class xc yc w h: {line.strip()[:60]!r}", path) from None
        if not (w > 0 and h > 0 and 0 <= xc <= 1 and 0 <= yc <= 1 and w <= 2 and h <= 2):
            raise DataError(f"line {n}: the box is empty or off the image: {line.strip()[:60]!r}", path)
        rows.append(((xc - w / 2) * width, (xc + w / 2) * width, (yc - h / 2) * height, (yc + h / 2) * height))
    return np.array(rows, np.float32).reshape(-1, 4)


def _themis_images(root: Path, split: str | None) -> list[RealImage]:
    """The themis-dayir-mars tiles of ``split`` (duplicates never), with the catalogue's boxes."""
    out = []
    splits = SET_SPLITS["themis-dayir-mars"]
    for name, s in sorted(splits.items(), key=lambda kv: int(kv[0][len("crater"):])):
        if s == "duplicate" or (split is not None and s != split):
            continue
        img = root / "dataset_generation" / "416_train_val" / "train" / "images" / f"{name}.jpg"
        txt = root / "dataset_generation" / "416_train_val" / "train" / "labels_backup" / f"{name}.txt"
        for f in (img, txt):
            if not f.is_file():
                raise DataError(f"missing; copy the set with trn-detect real-set themis-dayir-mars --from SNAPSHOT "
                                f"--out {root}", f)
        out.append(RealImage(img, name, s, read_yolo_boxes(txt, THEMIS_TILE_PX, THEMIS_TILE_PX)))
    return out


def _francis_images(root: Path, split: str | None, labels: str = "default",
                    doubtful: bool = False) -> list[RealImage]:
    """The francis-ctx-mars tiles of ``split``: ``labels`` "default" gives the expert's boxes on
    the test tiles and the merged boxes of at least :data:`FRANCIS_MIN_CONFIDENCE` annotators on
    the others; "merged" those merged boxes on every tile. With ``doubtful``, a tile scored against
    the merged boxes also carries the boxes fewer annotators drew as doubtful."""
    out = []
    for rel in sorted(real_set("francis-ctx-mars").files):
        m = FRANCIS_TILE.fullmatch(rel)
        if m is None:
            continue
        tile = m.group(1)
        if split is not None and FRANCIS_SPLIT[tile] != split:
            continue
        png = root / rel
        expert = FRANCIS_SPLIT[tile] == "test" and labels == "default"
        xml = root / "data" / "annotations" / ("expert" if expert else "clustered") / f"MC11E-{tile}.xml"
        for f in (png, xml):
            if not f.is_file():
                raise DataError(f"missing; copy the set with trn-detect real-set francis-ctx-mars --from SNAPSHOT "
                                f"--out {root}", f)
        boxes = read_voc_boxes(xml, 0 if expert else FRANCIS_MIN_CONFIDENCE)
        unsure = (read_voc_boxes(xml, 0, FRANCIS_MIN_CONFIDENCE - 1) if doubtful and not expert
                  else np.zeros((0, 4), np.float32))
        out.append(RealImage(png, f"MC11E-{tile}", FRANCIS_SPLIT[tile], boxes, unsure))
    return out


def ctx_mosaic(root: str | Path) -> Path:
    """The robbins-ctx-mars mosaic under ``root`` (a checked copy): its 9 x 9 tiles of 416 px put
    back in place, written beside them as ``CTX/stacked_CTX.png`` unless that file already holds
    exactly this mosaic (through a uniquely named temporary file, replaced at once)."""
    import cv2

    root = Path(root)
    mosaic = np.zeros((CTX_GRID * CTX_TILE_PX,) * 2, np.uint8)
    for rel in real_set("robbins-ctx-mars").files:
        m = CTX_TILE.fullmatch(rel)
        if m is None:
            continue
        f = root / rel
        a = cv2.imread(str(f), cv2.IMREAD_GRAYSCALE) if f.is_file() else None
        if a is None or a.shape != (CTX_TILE_PX, CTX_TILE_PX):
            raise DataError(f"missing or not a {CTX_TILE_PX} px tile; copy the set with trn-detect real-set "
                            f"robbins-ctx-mars --from SNAPSHOT --out {root}", f)
        r, c = int(m.group(1)), int(m.group(2))
        mosaic[r * CTX_TILE_PX:(r + 1) * CTX_TILE_PX, c * CTX_TILE_PX:(c + 1) * CTX_TILE_PX] = a
    out = root / "CTX" / f"{CTX_MOSAIC_NAME}.png"
    if out.is_file():
        old = cv2.imread(str(out), cv2.IMREAD_GRAYSCALE)
        if old is not None and np.array_equal(old, mosaic):
            return out  # already there (a read-only copy of the set stays usable)
    fd, tmp = tempfile.mkstemp(prefix=f".{CTX_MOSAIC_NAME}.", suffix=".png", dir=out.parent)
    os.close(fd)
    try:
        if not cv2.imwrite(tmp, mosaic):
            raise DataError("could not be written; is the set's directory writable?", Path(tmp))
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return out


def _ctx_images(root: Path) -> list[RealImage]:
    labels = root / "CTX" / "selected_craters_XY.txt"
    if not labels.is_file():
        raise DataError(f"missing; copy the set with trn-detect real-set robbins-ctx-mars --from SNAPSHOT --out {root}",
                        labels)
    dx, dy = CTX_LABEL_SHIFT_PX
    boxes = read_corner_boxes(labels) + np.array([dx, dx, dy, dy], np.float32)
    return [RealImage(ctx_mosaic(root), CTX_MOSAIC_NAME, "val", boxes)]


# the sets whose labels say how sure each box is (the annotators who drew it)
SETS_WITH_DOUBTFUL = ("francis-ctx-mars",)


def require_doubtful_labels(name: str) -> None:
    """Refuse set ``name`` where doubtful boxes are asked of it and its labels carry no agreement."""
    if name not in SETS_WITH_DOUBTFUL:
        raise ConfigError(f"{name}'s labels do not say how sure a box is; doubtful boxes come with "
                          f"{', '.join(SETS_WITH_DOUBTFUL)}")


def real_images(name: str, root: str | Path, split: str | None = None, doubtful: bool = False) -> list[RealImage]:
    """The labelled PNG images of set ``name`` under ``root`` (a checked copy), with their split
    (all splits when ``split`` is None), sorted by path. With ``doubtful`` (a set of
    :data:`SETS_WITH_DOUBTFUL` only) each image also carries the boxes its labels leave in doubt."""
    s = real_set(name)
    splits = SET_SPLITS[name]
    if doubtful:
        require_doubtful_labels(name)
    if name == "robbins-ctx-mars":
        return [] if split not in (None, splits[CTX_MOSAIC_NAME]) else _ctx_images(Path(root))
    if name == "francis-ctx-mars":
        return _francis_images(Path(root), split, doubtful=doubtful)
    if name == "themis-dayir-mars":
        return _themis_images(Path(root), split)
    out = []
    for rel in sorted(p for p in s.files if p.endswith(".png")):
        obs = observation_of(rel)
        if split is not None and splits[obs] != split:
            continue
        png = Path(root) / rel
        if not png.is_file():
            raise DataError(f"missing; copy the set with trn-detect real-set {name} --from SNAPSHOT --out {root}", png)
        out.append(RealImage(png, obs, splits[obs], read_boxes(png.with_suffix(".txt"))))
    return out


def write_tile_frames(images: list[RealImage], out: str | Path, factor: float, size: int = 256,
                      overlap: int = 64, min_box: float = 4.0) -> Path:
    """A detector data directory (the labels format :func:`trn.train.detector.load_frames` reads) of
    the tiles of ``images`` at ``factor`` network px per image px: each image resized by
    ``factor`` and cut into ``size`` px tiles (``overlap`` px shared, the last tile of a row or
    column ending at the image edge), a tile being one frame of ``size`` px, already at the
    network's input size, in the split of its image. A box is in the tile that holds its centre,
    clipped to the tile (``clipped`` set) and kept when both sides are at least ``min_box`` px
    there. An image's doubtful boxes go the same way, flagged ``doubtful`` (training ignores them).
    Frames have no altitude, Sun or position (0): the set has no georeference."""
    import cv2

    from trn.data.datasets import luna1
    from trn.data.datasets.labels import LabelledBox, LabelledFrame, write_labels
    from trn.detect.tiles import _starts

    out = Path(out)
    (out / luna1.NAV_IMAGES).mkdir(parents=True, exist_ok=True)
    frames, n, doubtful = [], 0, 0
    for im in images:
        a = cv2.imread(str(im.path), cv2.IMREAD_GRAYSCALE)
        if a is None:
            raise DataError("is not a readable image", im.path)
        h0, w0 = a.shape
        h, w = (max(size, int(round(v * factor))) for v in (h0, w0))
        a = cv2.resize(a, (w, h), interpolation=cv2.INTER_AREA if factor < 1 else cv2.INTER_LINEAR)
        # the labels, then the boxes the labels leave in doubt, flagged
        b = np.concatenate([im.boxes, im.doubtful]) * np.array([w / w0, w / w0, h / h0, h / h0], np.float32)
        unsure = np.arange(len(b)) >= len(im.boxes)
        doubtful += len(im.doubtful)
        cx, cy = (b[:, 0] + b[:, 1]) / 2, (b[:, 2] + b[:, 3]) / 2
        for y in _starts(h, size, overlap):
            for x in _starts(w, size, overlap):
                y0, x0 = int(y), int(x)
                inside = np.nonzero((cx >= x0) & (cx < x0 + size) & (cy >= y0) & (cy < y0 + size))[0]
                t = b[inside] - np.array([x0, x0, y0, y0], np.float32)
                c = np.clip(t, 0, size)
                keep = (c[:, 1] - c[:, 0] >= min_box) & (c[:, 3] - c[:, 2] >= min_box)
                clipped = (t != c).any(axis=1)
                boxes = tuple(LabelledBox(int(k), tuple(int(round(v)) for v in c[k]), 0.0, 0.0,
                                          bool(clipped[k]), bool(unsure[inside[k]]))
                              for k in np.nonzero(keep)[0])
                boxes = tuple(bx for bx in boxes if bx.box[1] > bx.box[0] and bx.box[3] > bx.box[2])
                cv2.imwrite(str(out / luna1.NAV_IMAGES / f"{n}.png"), a[y0:y0 + size, x0:x0 + size])
                frames.append(LabelledFrame(n, im.split, 0, 0.0, 0.0, 0.0, 0.0, boxes))
                n += 1
    settings = {"kind": "real-set tiles", "images": [str(im.path) for im in images], "factor": factor,
                "tile_px": size, "overlap_px": overlap, "min_box_px": min_box}
    if doubtful:
        settings["doubtful_boxes"] = doubtful
    return write_labels(out, settings, frames)
